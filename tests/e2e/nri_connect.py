"""Run an NRI plugin on a connection to the runtime's NRI socket made for it, as the runtime hands one to
the plugins it launches itself: the connected socket's descriptor in NRI_PLUGIN_SOCKET.

For a plugin that cannot be told the socket's path (containerd/nri's samples dial
/var/run/nri/nri.sock otherwise). This process connects, then execs the plugin: the plugin keeps its PID,
which the runtime read from the socket's peer credentials at the connection and logs in its plugin
invocation order.

    python -m tests.e2e.nri_connect SOCKET PLUGIN [ARGS...]
"""

from __future__ import annotations

import os
import socket
import sys

#: the stub's variable (github.com/containerd/nri/pkg/api: PluginSocketEnvVar)
SOCKET_ENV = "NRI_PLUGIN_SOCKET"


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m tests.e2e.nri_connect SOCKET PLUGIN [ARGS...]")
    path, command = argv[0], argv[1:]
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as err:
        sys.exit(f"nri_connect: {path}: {err}")
    conn.set_inheritable(True)
    os.environ[SOCKET_ENV] = str(conn.fileno())
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
