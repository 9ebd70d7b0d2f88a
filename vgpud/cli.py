"""The `vgpud` command line: `run`, `gpus`, `driver`, `health`, `webhook`, `debug tail|state`, `top`,
`version`.

Exit codes: 0 success (also after SIGTERM), 1 a runtime failure (GPU discovery, a component that
cannot start), 2 a usage or configuration error, printed as one line before anything starts.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import textwrap
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from vgpud import __version__
from vgpud.config import (
    DEFAULT_DRIVER_NAME,
    DRIVER_DESTS,
    GPU_SOURCE_DESTS,
    OPTIONS,
    add_settings_arguments,
    driver_settings_from,
    gpu_source_from,
    settings_from,
)
from vgpud.logs import configure_logging
from vgpud.options import ConfigError
from vgpud.parsers import parse_host_port
from vgpud.webhook.config import add_webhook_arguments

if TYPE_CHECKING:
    from vgpud.gpu.exclusion import Exclusion
    from vgpud.observe.client import Endpoint

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
#: where `vgpud run` puts its debug socket with the default plugins dir and driver name
DEFAULT_DEBUG_SOCKET = (
    f"{next(o.default for o in OPTIONS if o.dest == 'kubelet_plugins_dir')}/{DEFAULT_DRIVER_NAME}/debug.sock"
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="vgpud",
        description="Kubernetes node daemon that shares NVIDIA GPUs between containers: a DRA kubelet "
        "plugin and an NRI plugin that give each container its own memory and compute limit.",
        epilog="Every `run` flag can also be set through the environment variable named in its help. "
        "Run `vgpud COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"vgpud {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = commands.add_parser(
        "run",
        help="run the node daemon",
        description="Run the node daemon under its supervisor until SIGTERM or SIGINT. "
        "Development: `vgpud run --gpu-backend mock --gpu-profile a100-40gb-x2 --root-prefix /tmp/x "
        "--healthcheck-address 127.0.0.1` needs no GPU and no root.",
    )
    add_settings_arguments(run)

    gpus = commands.add_parser(
        "gpus",
        help="list the GPUs this node would publish",
        description="Discover the GPUs (NVML, or a mock profile) and print them.",
    )
    add_settings_arguments(gpus, GPU_SOURCE_DESTS)
    gpus.add_argument("--json", action="store_true", help="print JSON instead of a table")

    driver = commands.add_parser(
        "driver",
        help="show what a vGPU container receives from the NVIDIA driver",
        description="Find the driver's device nodes, libraries, binaries, firmware and IPC sockets under "
        "the driver root and dev root, as `vgpud run` does at start, and print each with its host and "
        "container path, or (--json) the CDI edits vgpud gives every vGPU container and each GPU.",
    )
    add_settings_arguments(driver, DRIVER_DESTS)
    driver.add_argument("--json", action="store_true", help="print the CDI edits as JSON")

    health = commands.add_parser(
        "health",
        help="ask a running vgpud whether it is healthy",
        description="Call the gRPC health service of a running vgpud; exit 0 when SERVING, 1 otherwise.",
    )
    health.add_argument(
        "--address",
        default="127.0.0.1:51515",
        metavar="HOST:PORT",
        help="the health service (default: 127.0.0.1:51515)",
    )
    health.add_argument("--service", default="liveness", help="service name (default: liveness)")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds (default: 3)")

    add_webhook_arguments(
        commands.add_parser(
            "webhook",
            help="serve the vGPU admission rules (HTTPS validating webhook)",
            description="Serve admission.k8s.io/v1 AdmissionReviews for pods and resource claims: the rules "
            "that keep per-container vGPU directories safe (no two containers share a vGPU request).",
        )
    )

    _add_debug_parser(commands)
    _add_top_parser(commands)

    commands.add_parser("version", help="print the version", description="Print vgpud's version.")
    return parser


def _add_debug_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    debug = commands.add_parser(
        "debug",
        help="look into a running vgpud: its state, its hook calls as they happen",
        description="Clients of a running vgpud's debug endpoint (a unix socket, root only; or the "
        "loopback address of `vgpud run --debug-address`).",
    )
    subcommands = debug.add_subparsers(
        dest="debug_command", metavar="SUBCOMMAND", parser_class=_Parser, required=True
    )
    tail = subcommands.add_parser(
        "tail",
        help="print hook calls as vgpud records them",
        description="Print every hook and RPC call vgpud records (NRI hooks, DRA Prepare/Unprepare, "
        "register calls) as it happens, until vgpud stops or Ctrl-C. Exit 0 when vgpud stops the "
        "stream, 1 when it cannot connect or drops this client as too slow.",
    )
    tail.add_argument("--json", action="store_true", help="one JSON object per line")
    tail.add_argument("--hook", default="", help="only this call (CreateContainer, Prepare, ...)")
    tail.add_argument("--component", default="", help="only this component (nri, dra, registry, hotplug)")
    tail.add_argument("--pod", default="", help="only this pod: UID, name or namespace/name")
    tail.add_argument("--claim", default="", help="only this claim UID")
    tail.add_argument("--outcome", default="", help="only this outcome (ok, error, skipped, rejected)")
    tail.add_argument(
        "-n", "--last", type=int, default=0, metavar="N", help="first print the last N matching calls"
    )
    tail.add_argument("--count", type=int, default=None, metavar="N", help="exit after N calls")
    state = subcommands.add_parser(
        "state",
        help="print vgpud's state as JSON",
        description="Print the state document: component health, NRI session and cache (directory -> "
        "container), eager partitions -> containers, unused register UUIDs, drift, recent calls.",
    )
    state.add_argument("--calls", type=int, default=20, metavar="N", help="recent calls to include")
    for sub in (tail, state):
        _add_endpoint_arguments(sub)


def _add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    """--socket or --address: where a client of the debug endpoint reads (`_endpoint`)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--socket",
        default=None,
        metavar="PATH",
        help=f"the debug unix socket (default: $DEBUG_SOCKET or {DEFAULT_DEBUG_SOCKET})",
    )
    where.add_argument("--address", default=None, metavar="HOST:PORT", help="the debug TCP address")


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be > 0 seconds")
    return value


TOP_EPILOG = f"""\
what it shows:
  a header: node, vgpud version, mode, healthy or not (the failing components), the NRI
  connection (lazy mode), the time of the reading; then each GPU: index, health (ok, UNHEALTHY
  with the watcher's reason, - without the device-health watcher), memory, allocated (the sum of
  its containers' memory limits, % of the memory), used (% of the memory), cores allocated (% of
  the GPU, may exceed 100) and SM utilization, product; under each GPU its vGPU containers
  (eager mode: partitions): namespace/pod/container, memory limit, used memory, core limit, SM
  share, PIDs. A line names the containers running without their vGPU injection, and one says
  when the usage reader is off (allocated and used unknown, not zero).

--json prints, once:
  {{"node", "mode", "time", "healthy",
   "gpus": the state's gpus section as it is (see vgpud debug state),
   "not_injected": [{{"container_id", "namespace", "pod", "pod_uid", "container", "missing"}}]}}

example:
  vgpud top                                  # every 2 s on this node's debug socket, q quits
  vgpud top --once | less -S                 # one reading, 120 columns when not a terminal
  vgpud top --interval 0.5 --socket {DEFAULT_DEBUG_SOCKET}
  vgpud top --json --address 127.0.0.1:9465  # a vgpud run with --debug-address 127.0.0.1:9465
"""


def _add_top_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    top = commands.add_parser(
        "top",
        help="a live view of this node's GPUs and the vGPU containers on each",
        description=textwrap.fill(
            "Show a running vgpud's GPUs and vGPU containers, like nvidia-smi for vGPUs: read "
            "/debug/state from its debug endpoint (the same one as `vgpud debug state`) every "
            "--interval seconds and redraw, until q or Ctrl-C (exit 0). A failed read shows its error "
            "and the next interval reads again. Exit 1 when --once or --json cannot read the "
            "endpoint, 2 on a usage error.",
            width=95,
        ),
        epilog=TOP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument(
        "--interval",
        type=_positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between readings (default: 2; any number > 0)",
    )
    once = top.add_mutually_exclusive_group()
    once.add_argument(
        "--once",
        action="store_true",
        help="print one reading and exit (the terminal's width, or 120 columns when not a terminal)",
    )
    once.add_argument("--json", action="store_true", help="print one reading as JSON (below) and exit")
    _add_endpoint_arguments(top)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "gpus":
            return _gpus(args)
        if args.command == "driver":
            return _driver(args)
        if args.command == "webhook":
            from vgpud.webhook.main import command

            return command(args)
        if args.command == "health":
            return _health(args)
        if args.command == "debug":
            return _debug(args)
        if args.command == "top":
            return _top(args)
        if args.command == "version":
            print(f"vgpud {__version__} (Python {platform.python_version()})")
            return EXIT_OK
    except ConfigError as err:
        print(f"vgpud {args.command}: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    configure_logging(settings.log_level, settings.log_format)
    from vgpud.daemon import run_daemon  # imported late: `vgpud --help` stays fast

    return run_daemon(settings)


def _exclusion_dict(why: Exclusion | None) -> dict[str, str] | None:
    """Why a GPU is not published (`vgpud gpus --json`'s `excluded`), or None."""
    return None if why is None else {"reason": why.reason.value, "detail": why.detail}


def _gpus(args: argparse.Namespace) -> int:
    from vgpud.gpu import GpuInventoryError

    source = gpu_source_from(args)
    try:
        gpus = source.inventory().gpus()
    except GpuInventoryError as err:
        print(f"vgpud gpus: error: {err}", file=sys.stderr)
        return EXIT_FAILURE
    if args.json:
        from vgpud.gpu.exclusion import excluded_gpus

        excluded = excluded_gpus(gpus)
        listed = [{**gpu.to_dict(), "excluded": _exclusion_dict(excluded.get(gpu.uuid))} for gpu in gpus]
        print(json.dumps(listed, indent=2))
        return EXIT_OK
    rows = [("INDEX", "MINOR", "UUID", "PRODUCT", "MEMORY", "CC", "PCI", "NUMA", "MIG")]
    rows += [
        (
            str(g.index),
            str(g.minor),
            g.uuid,
            g.product_name,
            f"{g.memory_total // 2**20} MiB",
            g.compute_capability,
            g.pci_bus_id,
            "-" if g.numa_node is None else str(g.numa_node),
            f"on ({len(g.mig_devices)} MIG devices)" if g.mig_mode else "-",
        )
        for g in gpus
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if gpus:
        print(
            f"driver {gpus[0].driver_version}, CUDA {gpus[0].cuda_driver_version}, "
            f"{len(gpus)} GPU(s) from {source.backend}"
        )
        if mig := sum(1 for g in gpus if g.mig_mode):
            print(f"{mig} GPU(s) in MIG mode: vgpud does not share them (left out of its ResourceSlice)")
    else:
        print(f"no GPUs found ({source.backend})")
    return EXIT_OK


def _driver(args: argparse.Namespace) -> int:
    from vgpud.dra.driveredits import driver_edits
    from vgpud.gpu import GpuInventoryError
    from vgpud.nvdriver.discover import DeviceNodeInfo, DriverRootError, discover
    from vgpud.nvdriver.node import cdi_hook

    source, roots, hook = driver_settings_from(args)
    try:
        gpus = source.inventory().gpus()
        if not gpus:
            raise GpuInventoryError(f"no GPUs found ({source.backend})")
        files = discover(roots, gpus[0].driver_version, [g.minor for g in gpus], cdi_hook(roots, hook))
    except (GpuInventoryError, DriverRootError) as err:
        print(f"vgpud driver: error: {err}", file=sys.stderr)
        return EXIT_FAILURE
    edits = driver_edits(files)
    if args.json:
        devices = [
            {
                "uuid": g.uuid,
                "index": g.index,
                "minor": g.minor,
                "containerEdits": edits.by_minor[g.minor].to_cdi(),
            }
            for g in gpus
        ]
        out = {
            "driverVersion": files.version,
            "driverRoot": str(roots.driver_host),
            "devRoot": str(roots.dev_host),
            "containerEdits": edits.common.to_cdi(),
            "devices": devices,
        }
        print(json.dumps(out, indent=2))
        return EXIT_OK
    print(f"driver {files.version}: driver root {roots.driver_host}, dev root {roots.dev_host}")
    for title, found in (
        ("libraries", files.libraries),
        ("binaries", files.binaries),
        ("firmware", files.firmware),
        ("IPC sockets", files.ipc),
    ):
        print(f"{title}:" if found else f"{title}: none")
        for f in found:
            print(f"  {f.host_path} -> {f.path}")

    def show(node: DeviceNodeInfo, what: str = "") -> None:
        mode = f"{node.major}:{node.minor}, mode {node.file_mode:o}"
        print(f"  {node.host_path} -> {node.path} ({mode}){what}")

    print("device nodes, every vGPU container:")
    for node in files.control_nodes:
        show(node)
    print("device nodes, each GPU's containers their GPU's only:")
    for g in gpus:
        show(files.gpu_nodes[g.minor], f": {g.uuid}")
    if files.cdi_hook:
        print(f"nvidia-cdi-hook {files.cdi_hook}: links {', '.join(files.links) or 'none'}")
    else:
        print(f"no nvidia-cdi-hook: the links are bind mounts ({', '.join(files.links) or 'none'})")
    return EXIT_OK


def _health(args: argparse.Namespace) -> int:
    import asyncio

    from vgpud.health import check_remote

    host, sep, port = args.address.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise ConfigError(f"--address {args.address!r} is not HOST:PORT")
    status = asyncio.run(check_remote(host, int(port), args.service, args.timeout))
    print(status)
    return EXIT_OK if status == "SERVING" else EXIT_FAILURE


def _endpoint(args: argparse.Namespace) -> Endpoint:
    """The debug endpoint that --socket / --address (`_add_endpoint_arguments`) name."""
    import os

    from vgpud.observe.client import Endpoint

    if args.address is not None:
        try:
            return Endpoint(address=parse_host_port(args.address))
        except ValueError as err:
            raise ConfigError(f"--address: {err}") from None
    return Endpoint(unix_path=Path(args.socket or os.environ.get("DEBUG_SOCKET") or DEFAULT_DEBUG_SOCKET))


def _debug(args: argparse.Namespace) -> int:
    import trio

    from vgpud.observe.client import state, tail
    from vgpud.observe.filters import CallFilter

    endpoint = _endpoint(args)
    if args.debug_command == "state":
        return state(endpoint, calls=args.calls)
    try:
        where = CallFilter(
            hook=args.hook, component=args.component, pod=args.pod, claim=args.claim, outcome=args.outcome
        )
    except ValueError as err:
        raise ConfigError(f"--outcome: {err}") from None
    try:
        return trio.run(partial(tail, endpoint, where, as_json=args.json, last=args.last, count=args.count))
    except KeyboardInterrupt:
        return EXIT_OK


def _top(args: argparse.Namespace) -> int:
    from vgpud.observe.topterm import live, once

    endpoint = _endpoint(args)
    if args.once or args.json:
        return once(endpoint, as_json=args.json)
    if not sys.stdout.isatty():
        raise ConfigError("the live view needs a terminal: --once or --json print one reading")
    return live(endpoint, args.interval)
