"""pynvml's library binding (its internals, named only here; tests/unit/compat/test_pynvml.py pins them).

pynvml keeps the loaded library in the module global `nvmlLib`, guarded by `libLoadLock`, and caches
function pointers looked up in it in `_nvmlGetFunctionPointer_cache`; `_LoadNvmlLibrary` (called by
nvmlInit) only loads "libnvidia-ml.so.1" when `nvmlLib` is None. vgpud loads the library it names
itself and binds it here, so every pynvml call after `bind` goes to that library.
"""

from __future__ import annotations

import ctypes

import pynvml


def bind(lib: ctypes.CDLL) -> None:
    """Make `lib` the library pynvml calls into (the function-pointer cache belonged to the old one)."""
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is not lib:
            pynvml.nvmlLib = lib
            pynvml._nvmlGetFunctionPointer_cache.clear()
