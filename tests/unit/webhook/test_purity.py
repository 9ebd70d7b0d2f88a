"""The rules, the review codec and the choice of a review's pods do no I/O (DESIGN §3: rules are pure
functions): imported and run in a process where the filesystem, the network and subprocesses raise."""

from __future__ import annotations

from tests.purity import run_without_io

BODY = """
    import json

    from tests import objects as o
    from vgpud.webhook import claims, podselect, review, rules
    from vgpud.webhook.violations import Rule, summary

    policy = claims.Policy(driver=o.DRIVER)
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
    assert [v.rule for v in violations] == [Rule.ONE_APP_PER_REQUEST], violations
    status = o.claim(requests=[o.exactly("r0")], results=[o.result("r0")], reserved_for=o.reserved(pod))
    assert len(rules.check_claim_status(status, claim, [pod], policy)) == 1
    kept = podselect.trim_pod(pod)
    assert podselect.select_pods([kept], "default", {"gpu-claim"}, ()) == [kept]
    assert len(rules.check_claim_status(status, claim, [kept], policy)) == 1
    out = review.review_response(request.uid, review.Decision.deny(summary(violations)))
    review.encode(out)

    loaded = [m for m in set(sys.modules) - before if m.startswith(("trio", "kubernetes", "h11", "ssl"))]
    assert not loaded, loaded
    print("pure")
"""


def test_rules_and_review_run_without_io() -> None:
    done = run_without_io(BODY)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pure\n"
