"""Run the Triton kernels on CPU tensors through Triton's interpreter.

``triton.jit`` picks compiled or interpreted execution when a kernel module is imported, reading
``TRITON_INTERPRET`` then. So it is set here, at conftest import (before any test module of this
package imports a kernel), and any kernel module some earlier test already imported is reloaded so
that the tests below get interpreted kernels whatever ran first in the process.
"""

from __future__ import annotations

import importlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

TRITON_MODULES = ("voxstream.kernels.paged_decode", "voxstream.kernels.fused")

for _name in TRITON_MODULES:
    if _name in sys.modules:
        importlib.reload(sys.modules[_name])
