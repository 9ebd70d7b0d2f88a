"""Helpers shared by the test tiers.

`require` is the one way a test says it needs an external component: under CI (CI=true) a missing
component is a failure that names what to install, never a silent skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(available: bool, what: str, how_to_get: str) -> None:
    """Skip locally, fail under CI, when `what` is not available."""
    if available:
        return
    message = f"{what} is missing: {how_to_get}"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def built(relative: str) -> Path:
    """Path of an artefact that `make build` produces under build/; required to exist."""
    path = BUILD / relative
    require(path.exists(), f"build/{relative}", "run `make build` (the test command does it)")
    return path


def unreachable_kubeconfig(path: Path) -> Path:
    """A kubeconfig at `path` whose API server is not there (https://127.0.0.1:1): for a daemon that
    must start and answer without one."""
    path.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    return path
