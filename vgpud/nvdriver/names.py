"""Where NVIDIA's driver keeps what a GPU container needs, and how it is handed over: one place.

These are the NVIDIA container toolkit's rules for `nvidia-ctk cdi generate --mode=nvml` (v1.20):
the library and executable search directories, the control device nodes, the binaries, firmware and
IPC sockets, the mount options, the `nvidia-cdi-hook` hooks and the env it sets. vgpud's edits follow
them so that a vGPU claim delivers what NVIDIA's own CDI spec for that GPU would (docs/driver-root.md
lists the few differences and why).
"""

from __future__ import annotations

from pathlib import PurePosixPath

#: the GPUs' character devices: /dev/nvidia<minor>, major 195 (the driver's registered major)
NVIDIA_MAJOR = 195
GPU_NODE_PREFIX = "nvidia"
DEV_DIR = PurePosixPath("/dev")
#: control nodes a CUDA process opens besides its GPUs, each handed over when the dev root has it
CONTROL_NODES = (
    PurePosixPath("/dev/nvidia-modeset"),
    PurePosixPath("/dev/nvidia-uvm-tools"),
    PurePosixPath("/dev/nvidia-uvm"),
    PurePosixPath("/dev/nvidiactl"),
)
#: what every device node gets in the container's device cgroup
DEVICE_PERMISSIONS = "rwm"

#: directories searched for the driver's libraries, relative to the driver root (the toolkit's
#: pkg/lookup/library.go list, x86_64 and aarch64); then the root's /etc/ld.so.cache
LIBRARY_SEARCH_DIRS = tuple(
    PurePosixPath(p)
    for p in (
        "/",
        "/usr/lib64",
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu/nvidia/current",
        "/usr/lib/aarch64-linux-gnu/nvidia/current",
        "/lib64",
        "/lib/x86_64-linux-gnu",
        "/lib/aarch64-linux-gnu",
        "/lib/x86_64-linux-gnu/nvidia/current",
        "/lib/aarch64-linux-gnu/nvidia/current",
    )
)
LD_SO_CACHE = PurePosixPath("/etc/ld.so.cache")
#: the libraries whose `.so.<driver version>` file proves where the driver's libraries live
VERSION_PROBES = ("libcuda.so.", "libnvidia-ml.so.")
#: a subdirectory of each library directory whose `*.so.<version>` files also belong to the driver
VDPAU_SUBDIR = "vdpau"
#: libraries of the driver not named with its version
UNVERSIONED_LIBRARIES = ("libnvidia-nvvm70.so.*",)
#: the NVML library a GPU backend loads from the driver root
NVML_SONAME = "libnvidia-ml.so.1"

#: executable search directories, relative to the driver root (the toolkit's default PATH)
EXECUTABLE_DIRS = tuple(
    PurePosixPath(p) for p in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
)
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)

#: firmware directories, relative to the driver root, after the kernel's custom firmware path
FIRMWARE_CLASS_PATH = PurePosixPath("/sys/module/firmware_class/parameters/path")
FIRMWARE_DIRS = (
    "/lib/firmware/updates/{release}",
    "/lib/firmware/updates",
    "/lib/firmware/{release}",
    "/lib/firmware",
)
FIRMWARE_PATTERNS = ("nvidia/{version}/gsp*.bin", "nvidia/{version}/ucodes*.bin")

#: IPC sockets: the first of each found under /run or /var/run. (The toolkit also names the MPS pipe
#: directory /tmp/nvidia-mps, but its lookup accepts files only, so a directory is never handed over.)
IPC_RUN_DIRS = (PurePosixPath("/run"), PurePosixPath("/var/run"))
IPC_SOCKETS = ("nvidia-persistenced/socket", "nvidia-fabricmanager/socket")

#: mount options: libraries, binaries and firmware read-only; IPC endpoints writable, never executable
FILE_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
IPC_MOUNT_OPTIONS = ("nosuid", "nodev", "rbind", "rprivate", "noexec")

#: NVIDIA's runtime selects devices by this variable; `void` selects none, so an image's `all`
#: cannot widen what CDI gave the container (CDI env entries replace the image's by name)
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
NVIDIA_VISIBLE_DEVICES_VOID = "void"
#: where the driver's libraries are, for nvidia-cdi-hook's enable-cuda-compat
ENV_LIBCUDA_DIR = "NVIDIA_CTK_LIBCUDA_DIR"
#: the NVIDIA runtime's device-list-as-volume-mounts strategy reads this dir; a `void` entry selects none
VOID_MOUNT = (PurePosixPath("/dev/null"), PurePosixPath("/var/run/nvidia-container-devices/void"))
VOID_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "bind")

#: nvidia-cdi-hook: where the toolkit installs it, relative to the driver root, when not configured
CDI_HOOK_NAME = "nvidia-cdi-hook"
CDI_HOOK_DIRS = (
    PurePosixPath("/usr/bin"),
    PurePosixPath("/usr/local/bin"),
    PurePosixPath("/usr/local/nvidia/toolkit"),
)
#: the OCI lifecycle point of every hook vgpud emits: in the container's namespaces, before pivot_root
HOOK_CREATE_CONTAINER = "createContainer"
HOOK_CREATE_SYMLINKS = "create-symlinks"
HOOK_ENABLE_CUDA_COMPAT = "enable-cuda-compat"
HOOK_UPDATE_LDCACHE = "update-ldcache"
HOOK_DISABLE_DEVICE_NODE_MODIFICATION = "disable-device-node-modification"
HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)

#: links the toolkit always adds beside some libraries: (library name prefix, the link's target or ''
#: for the library's own name, the link's name); a library matches when its name is prefix + "*.*"
EXTRA_LINKS = (
    ("libcuda.so.", "libcuda.so.1", "libcuda.so"),
    ("libGLX_nvidia.so.", "", "libGLX_indirect.so.0"),
    ("libnvidia-opticalflow.so.", "libnvidia-opticalflow.so.1", "libnvidia-opticalflow.so"),
)
