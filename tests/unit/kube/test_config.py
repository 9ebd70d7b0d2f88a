"""vgpud.kube.config: kubeconfig and in-cluster forms, token rotation, refusals, and TLS for real
(a local HTTPS server that requires a client certificate, certificates made with openssl)."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import require
from vgpud.kube.api import KubeError
from vgpud.kube.client import KubeClient
from vgpud.kube.config import TOKEN_REREAD_S, ApiConfig, TokenFile, from_kubeconfig, in_cluster


def write_kubeconfig(path: Path, cluster: dict[str, Any], user: dict[str, Any] | None = None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"} if user is not None else {"cluster": "c"}
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "other", "cluster": {"server": "https://wrong:1"}},
            {"name": "c", "cluster": cluster},
        ],
        "users": [{"name": "u", "user": user}] if user is not None else [],
        "contexts": [{"name": "x", "context": context}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(document))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_token_and_impersonation_headers(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", {"server": "https://h:6443/"}, {"token": "t0k", "as": "bob"})
    config = from_kubeconfig(path)
    assert config.server == "https://h:6443"
    assert config.headers() == {"Authorization": "Bearer t0k", "Impersonate-User": "bob"}


def test_no_user_sends_no_credentials(tmp_path: Path) -> None:
    assert from_kubeconfig(write_kubeconfig(tmp_path / "kc", {"server": "http://h:8080"})).headers() == {}


def test_a_token_file_is_relative_to_the_kubeconfig_and_read_again_as_it_rotates(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    config = from_kubeconfig(
        write_kubeconfig(tmp_path / "kc", {"server": "https://h:1"}, {"tokenFile": "token"})
    )
    assert config.headers()["Authorization"] == "Bearer first"
    now = [0.0]
    rotating = TokenFile(tmp_path / "token", clock=lambda: now[0])
    (tmp_path / "token").write_text("second")
    now[0] = TOKEN_REREAD_S - 1
    assert rotating.token() == "first"  # read at 0: still fresh
    now[0] = TOKEN_REREAD_S
    assert rotating.token() == "second"


def test_data_and_file_forms_give_the_same_pem(tmp_path: Path) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (tmp_path / "ca.crt").write_bytes(pem)
    (tmp_path / "c.crt").write_bytes(b"cert")
    (tmp_path / "c.key").write_bytes(b"key")
    by_file = from_kubeconfig(
        write_kubeconfig(
            tmp_path / "a",
            {"server": "https://h:1", "certificate-authority": "ca.crt"},
            {"client-certificate": str(tmp_path / "c.crt"), "client-key": "c.key"},
        )
    )
    by_data = from_kubeconfig(
        write_kubeconfig(
            tmp_path / "b",
            {"server": "https://h:1", "certificate-authority-data": b64(pem)},
            {"client-certificate-data": b64(b"cert"), "client-key-data": b64(b"key")},
        )
    )
    assert (by_file.ca_pem, by_file.client_cert_pem, by_file.client_key_pem) == (
        pem.decode(),
        b"cert",
        b"key",
    )
    assert (by_data.ca_pem, by_data.client_cert_pem, by_data.client_key_pem) == (
        pem.decode(),
        b"cert",
        b"key",
    )


@pytest.mark.parametrize(
    ("cluster", "user", "expected"),
    [
        ({"server": "https://h:1"}, {"exec": {"command": "aws"}}, "exec"),
        ({"server": "https://h:1"}, {"auth-provider": {"name": "gcp"}}, "auth-provider"),
        ({"server": "https://h:1"}, {"username": "a", "password": "b"}, "password, username"),
        ({"server": "https://h:1"}, {"as-groups": ["g"]}, "as-groups"),
        ({"server": "https://h:1", "proxy-url": "http://p:3128"}, {"token": "t"}, "proxy-url"),
        ({"server": "https://h:1", "tls-server-name": "api"}, {"token": "t"}, "tls-server-name"),
        ({"server": "h:1"}, {"token": "t"}, "no http(s) server URL"),
        ({"server": "https://h:1"}, {"client-certificate-data": b64(b"c")}, "without the other"),
        ({"server": "https://h:1", "certificate-authority-data": "%%%"}, {}, "not base64"),
        ({"server": "https://h:1", "certificate-authority": "absent.crt"}, {}, "absent.crt"),
        ({"server": "https://h:1"}, {"tokenFile": "absent-token"}, "absent-token"),
    ],
)
def test_what_it_cannot_honour_is_refused_by_name(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], expected: str
) -> None:
    with pytest.raises(KubeError) as e:
        from_kubeconfig(write_kubeconfig(tmp_path / "kc", cluster, user))
    assert expected in str(e.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[", "not YAML"),
        ("- a list", "not a kubeconfig"),
        ("clusters: []", "no current-context"),
        ("current-context: gone\ncontexts: []", "no context named 'gone'"),
    ],
)
def test_a_malformed_kubeconfig_is_refused(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "kc").write_text(text)
    with pytest.raises(KubeError, match=expected):
        from_kubeconfig(tmp_path / "kc")


def test_kubeconfig_lists_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    with pytest.raises(KubeError, match="a list of files"):
        KubeClient.from_config(None)


def test_in_cluster(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("PEM")
    (tmp_path / "token").write_text("sa-token")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    config = in_cluster(env, tmp_path)
    assert (config.server, config.ca_pem) == ("https://[fd00::1]:443", "PEM")
    assert config.headers() == {"Authorization": "Bearer sa-token"}
    assert (
        in_cluster({**env, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path).server == "https://10.0.0.1:443"
    )


@pytest.mark.parametrize(
    ("env", "files", "expected"),
    [
        ({}, {"ca.crt": "PEM", "token": "t"}, "KUBERNETES_SERVICE_HOST"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": ""}, {}, "KUBERNETES_SERVICE_PORT"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, {"token": "t"}, "ca.crt"),
        ({"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"}, {"ca.crt": "PEM"}, "token"),
        (
            {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1"},
            {"ca.crt": "P", "token": ""},
            "empty",
        ),
    ],
)
def test_in_cluster_says_what_is_missing(
    tmp_path: Path, env: dict[str, str], files: dict[str, str], expected: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(KubeError, match=expected):
        in_cluster(env, tmp_path)


# -- TLS for real -----------------------------------------------------------------------------------


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    require(shutil.which("openssl") is not None, "openssl", "apt-get install openssl")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        openssl(
            "req", "-x509", *ec, "-keyout", d / f"{ca}.key", "-out", d / f"{ca}.crt", "-subj", f"/CN={ca}"
        )
    for name, extension in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        openssl("req", *ec, "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr", "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(extension + "\n")
        openssl(
            "x509", "-req", "-in", d / f"{name}.csr", "-CA", d / "ca.crt", "-CAkey", d / "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", d / f"{name}.ext", "-out", d / f"{name}.crt",
        )  # fmt: skip
    return Pki(
        d / "ca.crt",
        d / "server.crt",
        d / "server.key",
        d / "client.crt",
        d / "client.key",
        d / "other-ca.crt",
    )


@pytest.fixture
def mtls_server(pki: Pki) -> Iterator[str]:
    """https://127.0.0.1:PORT answering any GET with the client certificate's CN as a Node's name."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            peer = self.connection.getpeercert()  # type: ignore[attr-defined]
            cn = dict(item[0] for item in peer["subject"])["commonName"]
            body = json.dumps({"metadata": {"name": cn}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


async def get_node_as(config: ApiConfig) -> str:
    client = KubeClient(config)
    try:
        return (await client.get_node("n"))["metadata"]["name"]
    finally:
        client.close()


@pytest.mark.parametrize("form", ["data", "file"])
async def test_client_certificates_authenticate(
    tmp_path: Path, pki: Pki, mtls_server: str, form: str
) -> None:
    if form == "data":
        cluster = {"server": mtls_server, "certificate-authority-data": b64(pki.ca.read_bytes())}
        user = {"client-certificate-data": b64(pki.client_cert.read_bytes())}
        user["client-key-data"] = b64(pki.client_key.read_bytes())
    else:
        cluster = {"server": mtls_server, "certificate-authority": str(pki.ca)}
        user = {"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)}
    assert await get_node_as(from_kubeconfig(write_kubeconfig(tmp_path / "kc", cluster, user))) == "client"


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # asked for
async def test_the_server_is_verified_unless_told_not_to(tmp_path: Path, pki: Pki, mtls_server: str) -> None:
    user = {"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)}
    wrong_ca = {"server": mtls_server, "certificate-authority": str(pki.other_ca)}
    with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED") as e:
        await get_node_as(from_kubeconfig(write_kubeconfig(tmp_path / "a", wrong_ca, user)))
    assert e.value.status == 0
    insecure = {"server": mtls_server, "insecure-skip-tls-verify": True}
    assert await get_node_as(from_kubeconfig(write_kubeconfig(tmp_path / "b", insecure, user))) == "client"


async def test_without_a_client_certificate_the_server_refuses(
    tmp_path: Path, pki: Pki, mtls_server: str
) -> None:
    cluster = {"server": mtls_server, "certificate-authority": str(pki.ca)}
    with pytest.raises(KubeError, match="unreachable"):
        await get_node_as(from_kubeconfig(write_kubeconfig(tmp_path / "kc", cluster, {"token": "t"})))


def test_an_unusable_key_is_refused(tmp_path: Path, pki: Pki) -> None:
    config = ApiConfig(
        server="https://h:1", client_cert_pem=pki.client_cert.read_bytes(), client_key_pem=b"junk"
    )
    with pytest.raises(KubeError, match="client certificate or key is not usable"):
        config.ssl_context()
