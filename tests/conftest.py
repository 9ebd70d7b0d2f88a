"""Fixtures shared by every test tier."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

#: the real etcd + kube-apiserver session fixture `kube_apiserver`
pytest_plugins = ("tests.kubeapi",)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path: unix socket addresses hold at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="vg", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
