"""The rules and the review codec do no I/O (DESIGN §3: rules are pure functions): imported and run in
a process where the filesystem, the network and subprocesses raise."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support import REPO

SCRIPT = textwrap.dedent("""
    import builtins, io, json, os, shutil, socket, subprocess, sys

    import vgpud  # reads its version from installed metadata: the parent's business, done first
    from tests import objects as o

    class IOAttempted(AssertionError):
        pass

    def forbidden(name):
        def refuse(*args, **kwargs):
            raise IOAttempted(f"{name} called with {args!r}")
        return refuse

    for module, names in [
        (builtins, ["open"]), (io, ["open", "FileIO"]),
        (os, ["open", "stat", "lstat", "listdir", "scandir", "mkdir", "remove", "unlink", "rename",
              "replace", "system", "popen"]),
        (shutil, ["rmtree", "copy", "move"]),
        (socket, ["socket", "create_connection", "getaddrinfo", "socketpair"]),
        (subprocess, ["Popen", "run"]),
    ]:
        for name in names:
            setattr(module, name, forbidden(f"{module.__name__}.{name}"))

    before = set(sys.modules)
    from vgpud.webhook import review, rules

    policy = rules.Policy(driver=o.DRIVER)
    claim = o.claim(requests=[o.exactly("r0")], results=[o.result("r0")])
    pod = o.pod("p", o.POD1_UID, containers=[o.container("a", o.ref("gpu")), o.container("b", o.ref("gpu"))])
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u", "operation": "CREATE", "namespace": "default", "name": "p", "object": pod,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
        },
    }
    request = review.parse_review(json.dumps(body).encode())
    violations = rules.check_pod(request.object_with_identity(), {"gpu-claim": claim}, {}, [pod], policy)
    assert [v.rule for v in violations] == [rules.Rule.ONE_APP_PER_REQUEST], violations
    status = o.claim(requests=[o.exactly("r0")], results=[o.result("r0")], reserved_for=o.reserved(pod))
    assert len(rules.check_claim_status(status, claim, [pod], policy)) == 1
    out = review.review_response(request.uid, review.Decision.deny(rules.summary(violations)))
    review.encode(out)

    loaded = [m for m in set(sys.modules) - before if m.startswith(("trio", "kubernetes", "h11", "ssl"))]
    assert not loaded, loaded
    print("pure")
""")


def test_rules_and_review_run_without_io() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pure\n"
