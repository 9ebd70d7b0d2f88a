"""Every Prometheus metric vgpud exposes: name, help and labels, declared once.

The metric objects live with the process that serves them (the node daemon, `vgpud webhook`), each in
its own registry; this module only fixes what an operator's dashboards and alerts depend on, so a name
is never spelled twice and a rename shows up in one diff. Later components add their entries here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricName:
    """One metric: the exposed name (counters end in `_total`), its help text and label names."""

    name: str
    help: str
    labels: tuple[str, ...] = ()


#: every admission review the webhook answered, and every request it refused as malformed;
#: kind: pods, resourceclaims, resourceclaims/status, other, or - for a body that is no review;
#: result: allowed, denied, error (a lookup failed: denied, fail-closed) or bad_request (HTTP 4xx)
WEBHOOK_REVIEWS = MetricName(
    "vgpud_webhook_reviews_total",
    "Admission reviews answered by the vgpud webhook, by resource, operation and result.",
    ("kind", "operation", "result"),
)

#: time from a complete request body to the answer being ready, lookups through the API included
WEBHOOK_REVIEW_DURATION = MetricName(
    "vgpud_webhook_review_duration_seconds",
    "Time the vgpud webhook took to decide one admission review.",
    ("kind",),
)

#: the serving certificate currently in use was loaded at this time (seconds since the epoch)
WEBHOOK_TLS_LOADED = MetricName(
    "vgpud_webhook_tls_loaded_timestamp_seconds",
    "When the vgpud webhook last loaded its serving certificate.",
)

#: reloading a changed certificate/key pair failed; the previous pair stays in use
WEBHOOK_TLS_RELOAD_FAILURES = MetricName(
    "vgpud_webhook_tls_reload_failures_total",
    "Changed certificate or key files the vgpud webhook could not load (the previous pair stays).",
)

ALL: tuple[MetricName, ...] = (
    WEBHOOK_REVIEWS,
    WEBHOOK_REVIEW_DURATION,
    WEBHOOK_TLS_LOADED,
    WEBHOOK_TLS_RELOAD_FAILURES,
)
