"""Where vgpud finds the C parts it installs on the node: the build's output, by default.

`make build` puts the control library and the register client into `build/libvgpu/` of the
checkout vgpud runs from; `--library-source` and `--register-client-source` name other files (an
image that ships them elsewhere). There is no fallback: a node without the library would give its
containers limits that nothing enforces, so vgpud refuses to start instead (`nodesetup`).
"""

from __future__ import annotations

from pathlib import Path

#: `build/libvgpu` next to the `vgpud` package (the checkout's build directory)
BUILD_LIBVGPU = Path(__file__).resolve().parent.parent / "build" / "libvgpu"
DEFAULT_LIBRARY_SOURCE = BUILD_LIBVGPU / "libvgpu-control.so"
DEFAULT_REGISTER_CLIENT_SOURCE = BUILD_LIBVGPU / "vgpu-register"
