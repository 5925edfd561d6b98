"""A script under ``scripts/`` loaded as a module, for the tests that call its functions (scripts are not a
package, so they cannot be imported by name)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path``, run once as the module ``name`` and registered under it in ``sys.modules``: a
    dataclass looks its module up while its class is built."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
