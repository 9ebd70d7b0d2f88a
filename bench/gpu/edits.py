"""vgpud's GPU edits (`vgpud driver --json`) against NVIDIA's container toolkit's CDI spec
(`nvidia-ctk cdi generate --mode=nvml`) for the same driver: pure functions.

Both sides become the same items, per scope (`common`, the spec-level edits, or a GPU's UUID): device
nodes (by path, every field compared), mounts (hostPath, containerPath, options: vgpud's `type: bind`
is implied by the options), env (by name), hooks (by nvidia-cdi-hook subcommand; the repeated
`--link` / `--folder` arguments each an item of their own) and additional GIDs. Every item on one
side only, or changed, is a difference; `ALLOWED_DIFFERENCES` is the one list of those vgpud
documents (the toolkit's graphics files, DRI nodes and two hooks it does not emit), each with why.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

COMMON = "common"
TOOLKIT = "toolkit"
VGPUD = "vgpud"
#: nvidia-cdi-hook arguments that repeat, one value each (compared value by value)
REPEATED_HOOK_FLAGS = ("--link", "--folder")


@dataclass(frozen=True)
class Difference:
    """One item of one scope that the two sides do not share (only_in) or hold differently."""

    scope: str
    kind: str  # device_node | mount | env | hook | hook_arg | gid | device
    key: str
    only_in: str | None  # TOOLKIT, VGPUD, or None: on both, changed
    toolkit: Any = None
    vgpud: Any = None


@dataclass(frozen=True)
class Context:
    """What a rule may look at besides the difference itself."""

    version: str
    #: the toolkit-only differences (for the folders of graphics files)
    toolkit_only: tuple[Difference, ...]
    #: basenames of vgpud's links and their targets (libcuda.so.1, ...): never "graphics" when the
    #: toolkit mounts one as a file
    vgpud_link_names: frozenset


# --------------------------------------------------------------------------------------------------
# What vgpud documents as not handed over (docs/driver-root.md): the one list.

GRAPHICS_CONFIGS = (
    "*/glvnd/egl_vendor.d/*",
    "*/egl/egl_external_platform.d/*",
    "*/vulkan/icd.d/*",
    "*/vulkan/implicit_layer.d/*",
    "*/X11/xorg.conf.d/*",
    "*/nvidia/nvoptix.bin",
)
XORG_MODULES = ("nvidia_drv.so", "libglxserver_nvidia.so*")
GRAPHICS_LINKS = ("nvidia-drm_gbm.so", "libnvidia-vulkan-producer.so", "libglxserver_nvidia.so")


def _name(path: str) -> str:
    return PurePosixPath(path).name


def _link(value: str) -> tuple[str, str]:
    """`--link target::link` -> (target, link)."""
    target, _, link = value.partition("::")
    return target, link


def _toolkit_hook(name: str, scope: Callable[[str], bool]) -> Callable[[Difference, Context], bool]:
    return lambda d, _: d.kind == "hook" and d.key == name and scope(d.scope)


def _dri(d: Difference, _: Context) -> bool:
    if d.kind == "device_node":
        return d.key.startswith("/dev/dri/")
    if d.kind == "hook_arg" and d.key.startswith("create-symlinks --link "):
        return _link(d.key.split(" ", 2)[2])[1].startswith("/dev/dri/")
    if d.kind == "hook" and d.key == "create-symlinks" and d.scope != COMMON:
        links = [_link(v)[1] for v in d.toolkit.get("--link", [])]
        return bool(links) and all(link.startswith("/dev/dri/") for link in links)
    return False


def _mount_name(d: Difference) -> str:
    return _name(d.toolkit["containerPath"]) if d.kind == "mount" else ""


def _graphics_config(d: Difference, _: Context) -> bool:
    return d.kind == "mount" and any(
        fnmatch.fnmatchcase(d.toolkit["containerPath"], p) for p in GRAPHICS_CONFIGS
    )


def _xorg(d: Difference, _: Context) -> bool:
    return d.kind == "mount" and any(fnmatch.fnmatchcase(_mount_name(d), p) for p in XORG_MODULES)


def _egl(d: Difference, _: Context) -> bool:
    return d.kind == "mount" and fnmatch.fnmatchcase(_mount_name(d), "libnvidia-egl-*")


def _unversioned(d: Difference, ctx: Context) -> bool:
    name = _mount_name(d)
    return (
        fnmatch.fnmatchcase(name, "lib*.so*")
        and f".so.{ctx.version}" not in name
        and not fnmatch.fnmatchcase(name, "libnvidia-nvvm*")  # vgpud hands the NVVM library over
        and name not in ctx.vgpud_link_names
    )


def _graphics_link(d: Difference, _: Context) -> bool:
    if d.kind != "hook_arg" or not d.key.startswith("create-symlinks --link "):
        return False
    return _name(_link(d.key.split(" ", 2)[2])[1]) in GRAPHICS_LINKS


def _graphics_folder(d: Difference, ctx: Context) -> bool:
    """An update-ldcache folder that only the toolkit's graphics files (allowed themselves) need."""
    if d.kind != "hook_arg" or not d.key.startswith("update-ldcache --folder "):
        return False
    folder = d.key.split(" ", 2)[2]
    inside = [
        o
        for o in ctx.toolkit_only
        if o.kind == "mount" and str(PurePosixPath(o.toolkit["containerPath"]).parent) == folder
    ]
    return bool(inside) and all(allowed(o, ctx) is not None for o in inside)


@dataclass(frozen=True)
class Allowance:
    name: str
    why: str
    matches: Callable[[Difference, Context], bool]


#: every difference vgpud's edits may have from the toolkit's, all of them things the toolkit has and
#: vgpud does not hand over; anything else (a difference of vgpud's own, or a changed item) fails
ALLOWED_DIFFERENCES: tuple[Allowance, ...] = (
    Allowance(
        "update-application-profile",
        "nvidia-cdi-hook update-application-profile: the EGL application profile (graphics); vgpud "
        "does not emit it",
        _toolkit_hook("update-application-profile", lambda scope: scope == COMMON),
    ),
    Allowance(
        "apply-cuda-memory-limits",
        "nvidia-cdi-hook apply-cuda-memory-limits per device: the driver's own memory limit; vgpud's limits "
        "are the control library's",
        _toolkit_hook("apply-cuda-memory-limits", lambda scope: scope != COMMON),
    ),
    Allowance(
        "dri-nodes",
        "a DRI device node (/dev/dri/card*, renderD*) or its by-path link: graphics, not handed over",
        _dri,
    ),
    Allowance(
        "graphics-configs",
        "an EGL / Vulkan / Xorg configuration file (or OptiX's nvoptix.bin) of the toolkit's graphics mounts",
        _graphics_config,
    ),
    Allowance("xorg-modules", "an Xorg module (nvidia_drv.so, libglxserver_nvidia.so.*)", _xorg),
    Allowance("egl-libraries", "an EGL platform library (libnvidia-egl-*: gbm, wayland, xcb, xlib)", _egl),
    Allowance(
        "unversioned-libraries",
        "a library not named with the driver version (vgpud hands over the driver's *.so.<version> files)",
        _unversioned,
    ),
    Allowance(
        "graphics-links",
        "a create-symlinks link of the toolkit's graphics libraries (gbm/nvidia-drm_gbm.so, "
        "libnvidia-vulkan-producer.so, libglxserver_nvidia.so)",
        _graphics_link,
    ),
    Allowance(
        "graphics-folders",
        "an update-ldcache folder holding only graphics files the toolkit mounts and vgpud does not",
        _graphics_folder,
    ),
)


def allowed(d: Difference, ctx: Context) -> Allowance | None:
    """The allowance covering `d` (only toolkit-only items can be), or None."""
    if d.only_in != TOOLKIT:
        return None
    return next((a for a in ALLOWED_DIFFERENCES if a.matches(d, ctx)), None)


# --------------------------------------------------------------------------------------------------
# Normalising both sides


def scopes_of_vgpud(out: dict) -> dict[str, dict]:
    """`vgpud driver --json` -> {scope: CDI container edits}."""
    scopes = {COMMON: out.get("containerEdits") or {}}
    for device in out.get("devices", ()):
        scopes[device["uuid"]] = device.get("containerEdits") or {}
    return scopes


def scopes_of_toolkit(spec: dict) -> dict[str, dict]:
    """A `nvidia-ctk cdi generate --device-name-strategy=uuid` spec -> {scope: CDI container edits}."""
    scopes = {COMMON: spec.get("containerEdits") or {}}
    for device in spec.get("devices", ()):
        scopes[device["name"]] = device.get("containerEdits") or {}
    return scopes


def split_hook_args(args: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """A hook's arguments after the subcommand: the fixed ones, and the values of each repeated flag."""
    fixed: list[str] = []
    repeated: dict[str, list[str]] = {}
    i = 0
    while i < len(args):
        if args[i] in REPEATED_HOOK_FLAGS and i + 1 < len(args):
            repeated.setdefault(args[i], []).append(args[i + 1])
            i += 2
        else:
            fixed.append(args[i])
            i += 1
    return fixed, repeated


def items(edits: dict) -> dict[tuple[str, str], Any]:
    """One scope's edits as comparable items."""
    out: dict[tuple[str, str], Any] = {}
    for node in edits.get("deviceNodes") or ():
        full = {"minor": 0, "major": 0, **node}
        out[("device_node", node["path"])] = full
    for mount in edits.get("mounts") or ():
        key = json.dumps([mount["hostPath"], mount["containerPath"], list(mount.get("options") or ())])
        out[("mount", key)] = {
            "hostPath": mount["hostPath"],
            "containerPath": mount["containerPath"],
            "options": list(mount.get("options") or ()),
        }
    for entry in edits.get("env") or ():
        name, _, value = entry.partition("=")
        out[("env", name)] = value
    seen: dict[str, int] = {}
    for hook in edits.get("hooks") or ():
        args = list(hook.get("args") or ())
        sub = args[1] if len(args) > 1 else PurePosixPath(hook["path"]).name
        seen[sub] = seen.get(sub, 0) + 1
        name = sub if seen[sub] == 1 else f"{sub}#{seen[sub]}"
        fixed, repeated = split_hook_args(args[2:])
        out[("hook", name)] = {
            "hookName": hook.get("hookName"),
            "path": hook["path"],
            "args": fixed,
            "env": list(hook.get("env") or ()),
            **repeated,
        }
        for flag, values in repeated.items():
            for value in values:
                out[("hook_arg", f"{name} {flag} {value}")] = value
    for gid in edits.get("additionalGids") or ():
        out[("gid", str(gid))] = gid
    return out


def _hook_identity(value: dict) -> dict:
    """A hook without its repeated arguments (those are compared one by one)."""
    return {k: v for k, v in value.items() if k not in REPEATED_HOOK_FLAGS}


def differences(theirs: dict[str, dict], ours: dict[str, dict]) -> list[Difference]:
    """Every item of every scope not shared by the toolkit's and vgpud's scopes."""
    found: list[Difference] = []
    for scope in sorted(set(theirs) | set(ours), key=lambda s: (s != COMMON, s)):
        if scope not in ours or scope not in theirs:
            side = TOOLKIT if scope in theirs else VGPUD
            found.append(Difference(scope, "device", scope, side))
            continue
        a, b = items(theirs[scope]), items(ours[scope])
        for key in sorted(set(a) | set(b)):
            kind, name = key
            if key not in b:
                found.append(Difference(scope, kind, name, TOOLKIT, toolkit=a[key]))
            elif key not in a:
                found.append(Difference(scope, kind, name, VGPUD, vgpud=b[key]))
            else:
                same = (
                    _hook_identity(a[key]) == _hook_identity(b[key]) if kind == "hook" else a[key] == b[key]
                )
                if not same:
                    found.append(Difference(scope, kind, name, None, toolkit=a[key], vgpud=b[key]))
    return found


def link_names(ours: dict[str, dict]) -> frozenset:
    """Basenames of the links vgpud's create-symlinks makes and of the names they point to."""
    names = set()
    for edits in ours.values():
        for (kind, _), value in items(edits).items():
            if kind == "hook":
                for target, link in (_link(v) for v in value.get("--link", [])):
                    names.update((_name(target), _name(link)))
    return frozenset(names)


def compare(spec: dict, out: dict) -> dict[str, Any]:
    """The toolkit's spec and vgpud's edits: every difference, each allowed one with its reason;
    `unexpected` counts the rest."""
    theirs, ours = scopes_of_toolkit(spec), scopes_of_vgpud(out)
    found = differences(theirs, ours)
    ctx = Context(
        version=str(out.get("driverVersion", "")),
        toolkit_only=tuple(d for d in found if d.only_in == TOOLKIT),
        vgpud_link_names=link_names(ours),
    )
    listed = []
    for d in found:
        allowance = allowed(d, ctx)
        entry: dict[str, Any] = {"scope": d.scope, "kind": d.kind, "key": d.key}
        if d.only_in:
            entry["only_in"] = d.only_in
        else:
            entry["toolkit"], entry["vgpud"] = d.toolkit, d.vgpud
        entry["allowed"] = allowance.name if allowance else None
        if allowance:
            entry["why"] = allowance.why
        listed.append(entry)
    return {
        "differences": listed,
        "allowed": sum(1 for e in listed if e["allowed"]),
        "unexpected": sum(1 for e in listed if not e["allowed"]),
    }


def summary(scopes: dict[str, dict]) -> dict[str, Any]:
    """One side's edits for the report: per scope its device nodes, mounts, env and hooks."""
    out: dict[str, Any] = {}
    for scope, edits in scopes.items():
        out[scope] = {
            "deviceNodes": [
                {
                    k: n.get(k, 0 if k == "minor" else None)
                    for k in ("path", "hostPath", "major", "minor", "fileMode")
                }
                for n in edits.get("deviceNodes") or ()
            ],
            "mounts": [
                [m["hostPath"], m["containerPath"], list(m.get("options") or ())]
                for m in edits.get("mounts") or ()
            ],
            "env": list(edits.get("env") or ()),
            "hooks": [
                [h.get("hookName"), h["path"], *(h.get("args") or ())] for h in edits.get("hooks") or ()
            ],
        }
        if edits.get("additionalGids"):
            out[scope]["additionalGids"] = list(edits["additionalGids"])
    return out
