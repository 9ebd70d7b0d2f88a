"""A container-like process for one GPU, from vgpud's CDI edits, without a container runtime.

`plan` turns the edits of one GPU (the spec-level edits + that GPU's) into a root to build: the
device nodes (made with mknod from the edits' major:minor and mode, as runc makes them), the mounts
(bind mounts from their host paths, with the edits' options), what the edits' nvidia-cdi-hook hooks
do, done here without the hook (HOOKS: create-symlinks' links made as symlinks, update-ldcache's
folders put into the root's linker cache by the host's `ldconfig -r`; the others need nothing in this
root), the control library at the path vgpud's claim edits use, the partition
directories at their container paths, and the minimal userland the probe needs: the host's dynamic
loader and the libraries `ldd` names for the probe, the control library and the driver's libraries
(copied; the driver's own files come only through the edits' mounts), plus the OCI default /dev/null,
zero, random, urandom, a /dev/shm tmpfs, /proc (of the new PID namespace) and /sys read-only.

`python3 -m bench.gpu.container PLAN.json` runs it: unshare(CLONE_NEWNS | CLONE_NEWPID) in this process,
every mount made private, fork (the child is PID 1 of the new namespace); the child mounts a fresh
tmpfs at the plan's root, builds it, pivot_root()s into it (chroot where pivot_root is refused),
prints `setup {json}` (what it made) and execs the probe with the plan's env. The runner exits with
the probe's status (125: the set-up failed, its reason on stderr). Standard library only, Python >= 3.8
(the GPU machine's python3). Needs root.
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from bench.gpu.edits import split_hook_args

#: where vgpud's claim edits put the control library, and LD_PRELOAD names it (vgpud.partition.layout)
CONT_CONTROL_LIBRARY = "/etc/vgpu-manager/driver/libvgpu-control.so"
#: the library's partition directories at their container paths (vgpud.partition.layout)
CONT_PARTITION_DIRS = ("/etc/vgpu-manager/config", "/tmp/.vgpu_lock", "/tmp/.vmem_node", "/tmp/.sm_node")
PROBE_PATH = "/usr/local/bin/ctrprobe"
CONTAINER_PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: the OCI runtime spec's default devices (what every container has besides its GPU edits)
DEFAULT_DEVICES = (("/dev/null", 1, 3), ("/dev/zero", 1, 5), ("/dev/random", 1, 8), ("/dev/urandom", 1, 9))
LDCONFIG_CONF = "/etc/ld.so.conf.d/00-vgpu-acceptance.conf"
#: the nvidia-cdi-hook subcommands of the edits: how this root gets what each does (the hook itself
#: is not run: it wants a runtime's OCI state and bundle)
HOOKS = {
    "create-symlinks": "done: each --link made as a symlink",
    "update-ldcache": f"done: its --folder values in {LDCONFIG_CONF}, then the host's ldconfig -X -r "
    "<root> (links are create-symlinks' job)",
    "enable-cuda-compat": "not needed: the root has no CUDA forward-compatibility libraries",
    "disable-device-node-modification": "not needed: no nvidia-modprobe in the root, the nodes exist",
}
SETUP_FAILED = 125
#: the driver's libraries a CUDA + NVML process loads (their host dependencies are the userland's);
#: the others (graphics, with their X11 / Wayland dependencies) are mounted but never loaded here
CUDA_LIBRARIES = (
    "libcuda.so.*",
    "libnvidia-ml.so.*",
    "libnvidia-ptxjitcompiler.so.*",
    "libnvidia-nvvm.so.*",
    "libnvidia-gpucomp.so.*",
)

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWPID = 0x00020000, 0x20000000
PR_SET_PDEATHSIG = 1
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
#: CDI mount options -> mount flags (the bind flags and propagation are handled apart)
OPTION_FLAGS = {"ro": MS_RDONLY, "rw": 0, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
BIND_OPTIONS = {"bind": 0, "rbind": MS_REC}
PROPAGATION = {"rprivate", "private"}


class PlanError(Exception):
    """The edits or the host cannot make the root (the message says what)."""


# --------------------------------------------------------------------------------------------------
# The plan (host side, no privileges)


def links_of(edits: dict) -> list[tuple[str, str]]:
    """(target, link) of every create-symlinks hook of `edits`."""
    out = []
    for hook in edits.get("hooks") or ():
        args = list(hook.get("args") or ())
        if len(args) > 1 and args[1] == "create-symlinks":
            for value in split_hook_args(args[2:])[1].get("--link", []):
                target, _, link = value.partition("::")
                out.append((target, link))
    return out


def ldcache_folders(edits: dict) -> list[str]:
    """The --folder values of every update-ldcache hook of `edits`."""
    out = []
    for hook in edits.get("hooks") or ():
        args = list(hook.get("args") or ())
        if len(args) > 1 and args[1] == "update-ldcache":
            out += split_hook_args(args[2:])[1].get("--folder", [])
    return out


def hooks(edits: dict) -> dict[str, str]:
    """The edits' hooks, each with how this root gets what it does."""
    out = {}
    for hook in edits.get("hooks") or ():
        args = list(hook.get("args") or ())
        name = args[1] if len(args) > 1 else hook["path"]
        out[name] = HOOKS.get(name, "not run: unknown to this check")
    return out


_LDD_LINE = re.compile(r"^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$")
#: names of the driver's own files: never copied from the host (they must come through the edits)
_DRIVER_NAME = re.compile(r"nvidia|libcuda|nvcuvid|nvoptix")


def host_userland(binaries: list[str], exclude: set[str]) -> list[str]:
    """The host files the loader maps for `binaries` (`ldd`), the dynamic loader included, less the
    files in `exclude` (real paths: the driver's, which come through the edits' mounts). A driver
    file that the edits do not mount is a PlanError: copying it would hide what the edits lack."""
    found: dict[str, None] = {}
    # as the container's loader will search: no LD_LIBRARY_PATH, nothing preloaded
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}
    for binary in binaries:
        done = subprocess.run(
            ["ldd", binary], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        if done.returncode != 0:
            raise PlanError(f"ldd {binary} failed ({done.returncode}): {done.stderr.strip()}")
        for line in done.stdout.splitlines():
            match = _LDD_LINE.match(line)
            if not match or os.path.realpath(match.group(1)) in exclude:
                continue
            if _DRIVER_NAME.search(PurePosixPath(match.group(1)).name):
                raise PlanError(f"{binary} needs {match.group(1)}, a driver file the edits do not mount")
            found.setdefault(match.group(1))
    return list(found)


def plan(
    common: dict,
    device: dict,
    *,
    root: Path,
    probe: Path,
    probe_args: list[str],
    library: Path,
    partition: Path,
    env: dict[str, str],
) -> dict[str, Any]:
    """The root of a container given `common` (the spec-level edits) and `device` (one GPU's edits):
    what run() builds, and the probe's command and env. `partition` is a directory for the library's
    partition directories; `env` is added to the edits' env (the library's variables)."""
    nodes = [
        {
            "path": path,
            "hostPath": path,
            "major": major,
            "minor": minor,
            "fileMode": 0o666,
            "origin": "oci-default",
        }
        for path, major, minor in DEFAULT_DEVICES
    ]
    for origin, edits in (("edits", common), ("edits-device", device)):
        for node in edits.get("deviceNodes") or ():
            nodes.append(
                {
                    "path": node["path"],
                    "hostPath": node.get("hostPath", node["path"]),
                    "major": node["major"],
                    "minor": node.get("minor", 0),
                    "fileMode": node.get("fileMode", 0o666),
                    "origin": origin,
                }
            )
    mounts = [
        {
            "hostPath": m["hostPath"],
            "containerPath": m["containerPath"],
            "options": list(m.get("options") or ()),
            "origin": "edits",
        }
        for edits in (common, device)
        for m in edits.get("mounts") or ()
    ]
    mounts.append(
        {
            "hostPath": str(library),
            "containerPath": CONT_CONTROL_LIBRARY,
            "options": ["ro", "nosuid", "nodev", "bind"],
            "origin": "control-library",
        }
    )
    for container_dir in CONT_PARTITION_DIRS:
        host_dir = partition / PurePosixPath(container_dir).name.lstrip(".")
        host_dir.mkdir(parents=True, exist_ok=True)
        mounts.append(
            {
                "hostPath": str(host_dir),
                "containerPath": container_dir,
                "options": ["rw", "nosuid", "nodev", "bind"],
                "origin": "partition",
            }
        )
    driver_files = {os.path.realpath(m["hostPath"]) for m in mounts if m["origin"] == "edits"}
    libraries = [
        m["hostPath"]
        for m in mounts
        if m["origin"] == "edits"
        and any(fnmatch.fnmatchcase(PurePosixPath(m["containerPath"]).name, p) for p in CUDA_LIBRARIES)
    ]
    userland = host_userland([str(probe), str(library), *libraries], driver_files)
    files = [{"source": os.path.realpath(path), "path": path, "mode": 0o755} for path in userland]
    files.append({"source": str(probe), "path": PROBE_PATH, "mode": 0o755})
    edits_env = [entry for edits in (common, device) for entry in edits.get("env") or ()]
    full_env = {"PATH": CONTAINER_PATH_ENV}
    full_env.update(entry.partition("=")[::2] for entry in edits_env)
    full_env.update(env)
    return {
        "root": str(root),
        "device_nodes": nodes,
        "mounts": mounts,
        "symlinks": [
            {"target": t, "link": link} for edits in (common, device) for t, link in links_of(edits)
        ],
        "hooks": {**hooks(common), **hooks(device)},
        "ldcache_folders": ldcache_folders(common) + ldcache_folders(device),
        "files": files,
        "argv": [PROBE_PATH, *probe_args],
        "env": full_env,
    }


# --------------------------------------------------------------------------------------------------
# The runner (root, in new namespaces)

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {source} on {target}")


def _inside(root: str, path: str) -> str:
    """`path` (absolute, as the container names it) under `root`, never above it."""
    parts = [p for p in PurePosixPath(path).parts[1:] if p not in ("", ".")]
    if ".." in parts or not parts:
        raise PlanError(f"container path {path!r} is not a plain absolute path")
    return os.path.join(root, *parts)


def bind(root: str, mount: dict) -> None:
    """A bind mount of the edits: its target made (a file or a directory, as the source is), the
    bind, then its flags by a remount, then its propagation."""
    source, target = mount["hostPath"], _inside(root, mount["containerPath"])
    flags, rec, private = 0, 0, False
    for option in mount["options"]:
        if option in OPTION_FLAGS:
            flags |= OPTION_FLAGS[option]
        elif option in BIND_OPTIONS:
            rec |= BIND_OPTIONS[option]
        elif option in PROPAGATION:
            private = True
        else:
            raise PlanError(f"mount option {option!r} of {mount['containerPath']} is not understood")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.lexists(target):
        with open(target, "w"):
            pass
    _mount(source, target, None, MS_BIND | rec)
    if flags:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | flags)
    if private:
        _mount(None, target, None, MS_PRIVATE | rec)


def build(spec: dict) -> dict[str, Any]:
    """The root of `spec` made under spec['root'] (a fresh tmpfs); what was made."""
    root = spec["root"]
    _mount("tmpfs", root, "tmpfs", MS_NOSUID, "mode=0755")
    for directory, mode in (("dev", 0o755), ("proc", 0o555), ("sys", 0o555), ("tmp", 0o1777), ("etc", 0o755)):
        os.mkdir(os.path.join(root, directory), mode)
        os.chmod(os.path.join(root, directory), mode)
    made: dict[str, Any] = {"device_nodes": [], "mounts": [], "symlinks": [], "files": []}
    for node in spec["device_nodes"]:
        made["device_nodes"].append(device_node(root, node))
    shm = os.path.join(root, "dev", "shm")
    os.mkdir(shm)
    _mount("shm", shm, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=1777")
    for item in spec["files"]:
        path = _inside(root, item["path"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        shutil.copyfile(item["source"], path)
        os.chmod(path, item["mode"])
        made["files"].append(item["path"])
    for mount in sorted(spec["mounts"], key=lambda m: len(PurePosixPath(m["containerPath"]).parts)):
        bind(root, mount)
        made["mounts"].append(f"{mount['hostPath']} -> {mount['containerPath']} ({mount['origin']})")
    for link in spec["symlinks"]:
        path = _inside(root, link["link"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            raise PlanError(f"create-symlinks: {link['link']} exists already in the root")
        os.symlink(link["target"], path)
        made["symlinks"].append(f"{link['link']} -> {link['target']}")
    if spec["ldcache_folders"]:
        made["ldcache"] = ldcache(root, spec["ldcache_folders"])
    try:
        _mount("proc", os.path.join(root, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        made["proc"] = "procfs of the new PID namespace"
    except OSError as exc:  # a container that masks parts of its /proc refuses a new procfs
        _mount("/proc", os.path.join(root, "proc"), None, MS_BIND | MS_REC)
        made["proc"] = f"the host's /proc bind-mounted (a new procfs was refused: {exc})"
    try:
        _mount("sysfs", os.path.join(root, "sys"), "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        made["sys"] = "sysfs, read-only"
    except OSError as exc:  # some sandboxes refuse a new sysfs; a container still runs without it
        made["sys"] = f"not mounted: {exc}"
    made["root"] = enter(root)
    return made


def ldcache(root: str, folders: list[str]) -> str:
    """update-ldcache's effect: the folders in the root's linker configuration, the root's
    /etc/ld.so.cache written by the host's ldconfig (-r: it chroots into the root; -X: no links)."""
    conf = _inside(root, LDCONFIG_CONF)
    os.makedirs(os.path.dirname(conf), exist_ok=True)
    with open(conf, "w") as out:
        out.write("".join(f"{folder}\n" for folder in folders))
    with open(_inside(root, "/etc/ld.so.conf"), "w") as out:
        out.write("include /etc/ld.so.conf.d/*.conf\n")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    done = subprocess.run(
        [ldconfig, "-X", "-r", root], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise PlanError(f"ldconfig -r of the root exited {done.returncode}: {done.stderr.strip()}")
    return f"{ldconfig} -X over {', '.join(folders)}"


def device_node(root: str, node: dict) -> str:
    """A character device of the plan, made with mknod as runc makes it; bind-mounted from its host
    path where mknod is refused (no CAP_MKNOD, as in a container). What was made, for the report."""
    path = _inside(root, node["path"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    what = f"{node['path']} {node['major']}:{node['minor']} ({node['origin']})"
    try:
        os.mknod(path, stat.S_IFCHR | node["fileMode"], os.makedev(node["major"], node["minor"]))
    except PermissionError:
        with open(path, "w"):
            pass
        _mount(node["hostPath"], path, None, MS_BIND)
        return f"{what}, bind-mounted from {node['hostPath']} (mknod refused)"
    os.chmod(path, node["fileMode"])  # mknod's mode went through the umask
    return what


def enter(root: str) -> str:
    """Make `root` this process's root: pivot_root (the old root detached), else chroot."""
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is not None:
        if _libc.syscall(ctypes.c_long(number), b".", b".") == 0:
            _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount2 of the old root")
            os.chdir("/")
            return "pivot_root"
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.EPERM):
            raise OSError(err, f"pivot_root: {os.strerror(err)}")
    os.chroot(".")
    os.chdir("/")
    return "chroot"


def child(spec: dict) -> None:
    """PID 1 of the new namespace: build, enter, exec the probe (never returns)."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        made = build(spec)
        sys.stdout.write("setup " + json.dumps(made) + "\n")
        sys.stdout.flush()
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except (OSError, PlanError, KeyError) as exc:
        sys.stderr.write(f"container: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
    os._exit(SETUP_FAILED)


def run(spec: dict) -> int:
    """The namespaces, the child, its exit status as the runner's."""
    _check(_libc.unshare(ctypes.c_int(CLONE_NEWNS | CLONE_NEWPID)), "unshare(CLONE_NEWNS | CLONE_NEWPID)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        child(spec)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sys.stderr.write(f"container: the probe was killed by signal {os.WTERMSIG(status)}\n")
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python3 -m bench.gpu.container PLAN.json\n")
        return 2
    try:
        spec = json.loads(Path(argv[0]).read_text())
        return run(spec)
    except (OSError, ValueError, PlanError) as exc:
        sys.stderr.write(f"container: {type(exc).__name__}: {exc}\n")
        return SETUP_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
