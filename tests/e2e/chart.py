"""vgpud on the local node the way users install it: the image imported into containerd, then
`helm install` of helm/vgpud with the values a node of this shape needs.

The values differ from the chart's defaults only where this node differs from a real one: its host
paths live under the node's temp dir, it has no kube-proxy (so pods reach the API server at 127.0.0.1,
through `kubernetesServiceHost`), its only pod network is the host's (so the webhook runs with
hostNetwork on a free port), it has no GPU (the mock backend) and no registry (the image is imported,
never pulled). Everything else, RBAC included, is the chart as shipped: vgpud runs with its
ServiceAccount's rights only.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.kubeapi import kube_env, log_tail
from tests.support import BUILD, REPO

CHART = REPO / "helm" / "vgpud"
NAMESPACE = "vgpud-system"
RELEASE = "vgpud"
IMAGE_ENV = BUILD / "image" / "image.env"
HELM_TIMEOUT = "180s"
INSTALL_HINT = "run make image and hack/install-kube.sh (the test command does both)"

if False:  # pragma: no cover - typing only
    from tests.e2e.node import LocalNode


def image_env() -> dict[str, str]:
    """build/image/image.env (hack/build-image.sh): VGPUD_IMAGE, VGPUD_IMAGE_TAR; {} when not built."""
    try:
        text = IMAGE_ENV.read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def helm_binary() -> Path | None:
    path = kube_env().get("HELM_BIN")
    return Path(path) if path and os.access(path, os.X_OK) else None


def chart_available() -> bool:
    """True when helm and the vgpud image are built."""
    image = image_env().get("VGPUD_IMAGE_TAR")
    return helm_binary() is not None and image is not None and Path(image).is_file()
