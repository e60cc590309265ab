"""The registry the operator serves at /metrics, and the live metrics in it.

What the ledger keeps is read from it at scrape time (``headroom.serving.ledgermetrics``).
Only what the ledger cannot know is a live metric here: latencies, write failures and
retries, watch restarts, API errors, webhook reviews, and which replica decides. The
control code reports through ``headroom.control.telemetry.Telemetry``, which this
class implements; the Kubernetes client, the webhook and the Lease are wired to it in
``headroom.main``.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headroom.kube.events import EventRecorder
from headroom.ledger import Ledger
from headroom.serving.ledgermetrics import PREFIX, LedgerCollector

#: The results of a pod-gating admission review (``headroom_webhook_reviews_total``).
REVIEW_RESULTS = ("allowed", "patched", "denied", "error")


def version() -> str:
    """The installed package's version (what ``headroom_build_info`` reports)."""
    try:
        return metadata.version("headroom")
    except metadata.PackageNotFoundError:
        return "unknown"


class EventsCollector(Collector):
    """The Event recorder's backlog: Events are posted off the hot path, so a burst of
    decisions leaves a queue that drains later (and work that is not idle CPU)."""

    def __init__(self, recorder: EventRecorder) -> None:
        self._recorder = recorder

    def collect(self) -> Iterator[Metric]:
        recorder = self._recorder
        yield GaugeMetricFamily(
            f"{PREFIX}_events_queued", "Kubernetes Events waiting to be posted.", recorder.queued
        )
        yield CounterMetricFamily(
            f"{PREFIX}_events_posted", "Kubernetes Events posted.", value=recorder.posted
        )
        yield CounterMetricFamily(
            f"{PREFIX}_events_dropped",
            "Kubernetes Events dropped because the queue was full.",
            value=recorder.dropped,
        )


class OperatorMetrics:
    """The registry the operator serves at /metrics."""

    def __init__(self, ledger: Callable[[], Ledger | None]) -> None:
        self.registry = registry = CollectorRegistry()
        registry.register(LedgerCollector(ledger))
        Gauge(
            f"{PREFIX}_build_info",
            "Always 1; the labels say which build runs.",
            ["version", "python_version"],
            registry=registry,
        ).labels(version(), platform.python_version()).set(1)
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 on the replica that decides (holds the Lease, or leader election off and "
            "ready), 0 otherwise.",
            registry=registry,
        )
        self.undecided = Gauge(
            f"{PREFIX}_undecided_reservations",
            "Reservations seen with no decision written to their status yet (waiting for "
            "the decider, or decided and not yet written); not those waiting for room.",
            registry=registry,
        )
        self.admission_latency = Histogram(
            f"{PREFIX}_admission_latency_seconds",
            "From the operator seeing a new reservation to its decision written to status.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.decisions = Counter(
            f"{PREFIX}_decisions",
            "Decisions written to status, by phase.",
            ["phase"],
            registry=registry,
        )
        self.status_write_failures = Counter(
            f"{PREFIX}_status_write_failures",
            "Status writes that failed and were rolled back or retried.",
            registry=registry,
        )
        self.status_write_retries = Counter(
            f"{PREFIX}_status_write_retries",
            "Status writes tried again after a failure (after a backoff).",
            registry=registry,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "From creation to admission, for reservations that waited for room.",
            buckets=(0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400),
            registry=registry,
        )
        self.pods_gated = Gauge(
            f"{PREFIX}_pods_gated",
            "Pods held now by the scheduling gate headroom.dev/admission.",
            registry=registry,
        )
        self.gate_wait = Histogram(
            f"{PREFIX}_pod_gate_seconds",
            "From the operator first seeing a gated pod to its pin-and-ungate patch landing.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600),
            registry=registry,
        )
        self.ungate_failures = Counter(
            f"{PREFIX}_pod_ungate_failures",
            "Pin-and-ungate patches refused (the reservation is reclaimed UngateRefused), by "
            "the API server's reason.",
            ["reason"],
            registry=registry,
        )
        self.reclaims = Counter(
            f"{PREFIX}_reclaims",
            "Reservations reclaimed, by reason.",
            ["reason"],
            registry=registry,
        )
        self.watch_restarts = Counter(
            f"{PREFIX}_watch_restarts",
            "Watch streams started again, by watch and why: ended (the server closed it, "
            "as it does at its timeout), expired (410 Gone: relisted), failed (an error or "
            "no answer).",
            ["resource", "reason"],
            registry=registry,
        )
        self.api_errors = Counter(
            f"{PREFIX}_api_errors",
            "Requests of the operator's own Kubernetes client that failed, by verb and code "
            "(the HTTP status, or timeout / connection when there was no answer).",
            ["verb", "code"],
            registry=registry,
        )
        self.webhook_reviews = Counter(
            f"{PREFIX}_webhook_reviews",
            "Pod admission reviews answered by the webhook, by result: allowed (unchanged), "
            "patched (gated), denied, error (not a readable AdmissionReview).",
            ["result"],
            registry=registry,
        )
        for result in REVIEW_RESULTS:
            self.webhook_reviews.labels(result)
        self.webhook_review_seconds = Histogram(
            f"{PREFIX}_webhook_review_seconds",
            "Time to answer one pod admission review, from its body read to its answer.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
            registry=registry,
        )

    # -- headroom.control.telemetry.Telemetry ------------------------------------------------

    def decision_written(self, phase: str, seconds_since_seen: float) -> None:
        self.admission_latency.observe(seconds_since_seen)
        self.decisions.labels(phase).inc()

    def reclaimed(self, reason: str) -> None:
        self.reclaims.labels(reason).inc()

    def waited(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def status_write_failed(self) -> None:
        self.status_write_failures.inc()

    def status_write_retried(self) -> None:
        self.status_write_retries.inc()

    def ungated(self, seconds: float) -> None:
        self.gate_wait.observe(seconds)

    def ungate_failed(self, reason: str) -> None:
        self.ungate_failures.labels(reason).inc()

    def watch_restarted(self, resource: str, reason: str) -> None:
        self.watch_restarts.labels(resource, reason).inc()

    # -- wired in headroom.main --------------------------------------------------------------

    def api_error(self, verb: str, code: str) -> None:
        """A request of the operator's client failed (called from the lease thread too)."""
        self.api_errors.labels(verb, code).inc()

    def reviewed(self, result: str, seconds: float) -> None:
        """The webhook answered one admission review."""
        self.webhook_reviews.labels(result).inc()
        self.webhook_review_seconds.observe(seconds)

    def count_gated(self, gated: Callable[[], int]) -> None:
        """Read the number of gated pods from ``gated`` at each scrape."""
        self.pods_gated.set_function(gated)

    def count_undecided(self, undecided: Callable[[], int]) -> None:
        """Read the number of undecided reservations from ``undecided`` at each scrape."""
        self.undecided.set_function(undecided)

    def follow_leadership(self, deciding: Callable[[], bool]) -> None:
        """Read at each scrape whether this replica decides."""
        self.leader.set_function(lambda: 1.0 if deciding() else 0.0)
