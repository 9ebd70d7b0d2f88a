"""`vgpud webhook` as a child process (self-signed TLS on 127.0.0.1), shared by the process test here
and the e2e test against a real API server."""

from __future__ import annotations

import http.client
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: how the webhook is started; becomes ["-m", "vgpud", "webhook"] once cli.py has the subcommand
ENTRY = ("-m", "vgpud", "webhook")


class WebhookProcess:
    def __init__(self, workdir: Path, *, port: int, kubeconfig: Path, extra: Sequence[str] = ()) -> None:
        self.workdir, self.port = workdir, port
        self.tls_dir = workdir / "tls"
        self.log = workdir / "webhook.log"
        self.out = workdir / "webhook.out"
        argv = [
            sys.executable,
            *ENTRY,
            "--self-signed",
            str(self.tls_dir),
            "--address",
            "127.0.0.1",
            "--port",
            str(port),
            "--kubeconfig",
            str(kubeconfig),
            *extra,
        ]
        with self.out.open("wb") as out, self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/validate"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def ca_bundle(self) -> str:
        """The base64 CA the process printed on stdout (`caBundle: ...`)."""
        for line in self.out.read_text().splitlines():
            if line.startswith("caBundle: "):
                return line.removeprefix("caBundle: ")
        raise AssertionError(f"no caBundle line on stdout: {self.out.read_text()!r}")

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.tls_dir / "ca.crt"))

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context(), timeout=15)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def review(self, document: dict[str, Any]) -> dict[str, Any]:
        status, body = self.request("POST", "/validate", json.dumps(document).encode())
        assert status == 200, body
        return json.loads(body)["response"]

    def wait_serving(self, deadline: float = 30) -> None:
        end = time.monotonic() + deadline
        last = "nothing yet"
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"webhook exited with {self.proc.returncode}:\n{self.output()}")
            if (self.tls_dir / "ca.crt").exists():
                try:
                    status, body = self.request("GET", "/healthz")
                    if status == 200:
                        return
                    last = f"{status} {body!r}"
                except (OSError, ssl.SSLError, http.client.HTTPException) as err:
                    last = repr(err)
            time.sleep(0.1)
        raise AssertionError(f"webhook not serving after {deadline}s ({last}):\n{self.output()}")

    def stop(self, timeout: float = 15) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
