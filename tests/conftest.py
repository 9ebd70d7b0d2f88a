"""Fixtures and hooks shared by every test tier.

The suite runs in random order (pytest-randomly, a dev dependency: modules, then the tests inside
each module, shuffled; session fixtures such as the local node stay shared). The seed is printed at
the start and in the summary, so a failing order can be replayed with `-p randomly --randomly-seed=N`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import in_ci

#: the real etcd + kube-apiserver session fixture `kube_apiserver`
pytest_plugins = ("tests.kubeapi",)

RANDOM_ORDER_PLUGIN = "randomly"


def order_line(config: pytest.Config) -> str:
    """How this session orders its tests, with the option that replays it."""
    if not config.pluginmanager.hasplugin(RANDOM_ORDER_PLUGIN):
        return "test order: as written (pytest-randomly is not installed or disabled with -p no:randomly)"
    if not config.getoption("randomly_reorganize"):
        return "test order: as written (--randomly-dont-reorganize)"
    seed = config.getoption("randomly_seed")
    return f"test order: random, replay with --randomly-seed={seed}"


def pytest_configure(config: pytest.Config) -> None:
    if in_ci() and not config.pluginmanager.hasplugin(RANDOM_ORDER_PLUGIN):
        raise pytest.UsageError(
            "pytest-randomly is missing: CI runs the tests in random order (`make setup` installs it)"
        )


def pytest_report_collectionfinish(config: pytest.Config) -> str:
    return order_line(config)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    terminalreporter.write_line(order_line(config))


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temp dir with a short path: unix socket addresses hold at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="vg", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
