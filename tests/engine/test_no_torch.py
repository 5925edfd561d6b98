"""The engine package (everything but the runner) must import without torch."""

from __future__ import annotations

import subprocess
import sys


def test_engine_package_does_not_import_torch():
    code = "import sys, voxstream.engine; assert 'torch' not in sys.modules, 'voxstream.engine imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
