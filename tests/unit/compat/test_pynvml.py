"""pynvml's internals that vgpud.compat.pynvml binds: each test fails if one moves or changes shape."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from vgpud.compat.pynvml import bind


@pytest.fixture(autouse=True)
def _restore_binding() -> Iterator[None]:
    before = pynvml.nvmlLib
    yield
    with pynvml.libLoadLock:
        pynvml.nvmlLib = before
        pynvml._nvmlGetFunctionPointer_cache.clear()


def _library(name: str) -> Any:
    return SimpleNamespace(nvmlSystemGetDriverVersion=f"{name}'s pointer")


def test_the_library_global_and_its_lock() -> None:
    assert hasattr(pynvml, "nvmlLib")
    assert isinstance(pynvml.libLoadLock, type(threading.Lock()))


def test_function_pointers_come_from_the_bound_library_and_the_cache_is_per_binding() -> None:
    """`_nvmlGetFunctionPointer` reads `nvmlLib` and caches in `_nvmlGetFunctionPointer_cache`."""
    assert isinstance(pynvml._nvmlGetFunctionPointer_cache, dict)
    bind(_library("a"))
    assert pynvml._nvmlGetFunctionPointer("nvmlSystemGetDriverVersion") == "a's pointer"
    assert "nvmlSystemGetDriverVersion" in pynvml._nvmlGetFunctionPointer_cache
    bind(_library("b"))
    assert pynvml._nvmlGetFunctionPointer("nvmlSystemGetDriverVersion") == "b's pointer"
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml._nvmlGetFunctionPointer("nvmlNoSuchFunction")


def test_init_does_not_replace_a_bound_library() -> None:
    """nvmlInit's loader (`_LoadNvmlLibrary`) loads libnvidia-ml.so.1 only when nothing is bound."""
    library = _library("ours")
    bind(library)
    pynvml._LoadNvmlLibrary()
    assert pynvml.nvmlLib is library
