"""The webhook's Prometheus metrics, in a registry of its own (names: vgpud.metrics_names).

Its own `CollectorRegistry` rather than the global one: `vgpud webhook` is its own process, and tests
build many servers in one process without colliding registrations.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from vgpud.metrics_names import (
    WEBHOOK_PRESET_RESULTS,
    WEBHOOK_PRESET_REVIEWS,
    WEBHOOK_REVIEW_DURATION,
    WEBHOOK_REVIEWS,
    WEBHOOK_TLS_LOADED,
    WEBHOOK_TLS_RELOAD_FAILURES,
)

#: the API server's webhook timeout is 10 s at most by default; buckets resolve the usual few ms
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class WebhookMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.reviews = Counter(
            WEBHOOK_REVIEWS.name, WEBHOOK_REVIEWS.help, WEBHOOK_REVIEWS.labels, registry=self.registry
        )
        self.duration = Histogram(
            WEBHOOK_REVIEW_DURATION.name,
            WEBHOOK_REVIEW_DURATION.help,
            WEBHOOK_REVIEW_DURATION.labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tls_loaded = Gauge(WEBHOOK_TLS_LOADED.name, WEBHOOK_TLS_LOADED.help, registry=self.registry)
        self.tls_reload_failures = Counter(
            WEBHOOK_TLS_RELOAD_FAILURES.name, WEBHOOK_TLS_RELOAD_FAILURES.help, registry=self.registry
        )
        for kind, operation in WEBHOOK_PRESET_REVIEWS:  # at 0 until the first review: rate() sees it
            self.duration.labels(kind=kind)
            for result in WEBHOOK_PRESET_RESULTS:
                self.reviews.labels(kind=kind, operation=operation, result=result)

    def review(self, kind: str, operation: str, result: str, seconds: float | None = None) -> None:
        self.reviews.labels(kind=kind, operation=operation, result=result).inc()
        if seconds is not None:
            self.duration.labels(kind=kind).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
