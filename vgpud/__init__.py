"""vgpud: share NVIDIA GPUs between Kubernetes containers through DRA and NRI."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("vgpud")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
