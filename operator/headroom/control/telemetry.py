"""What the control code reports, kept free of any metrics library.

The Prometheus implementation lives in ``headroom.serving.metrics``; the
simulation uses :class:`NoTelemetry`. Figures the ledger already keeps (reserved
MiB, active entries…) are not reported here: they are read from it at scrape time.
"""

from __future__ import annotations

from typing import Protocol


class Telemetry(Protocol):
    def decision_written(self, phase: str, seconds_since_seen: float) -> None:
        """A decision reached the object's status (latency from first sight)."""
        ...

    def reclaimed(self, reason: str) -> None: ...

    def waited(self, seconds: float) -> None:
        """A reservation that waited for room was admitted after ``seconds``."""
        ...

    def status_write_failed(self) -> None:
        """A status write was refused or unanswered and will be tried again (or given up)."""
        ...

    def status_write_retried(self) -> None:
        """A status write that failed is tried again (its backoff is over)."""
        ...

    def ungated(self, seconds: float) -> None:
        """A gated pod was pinned and ungated ``seconds`` after the operator first saw it."""
        ...

    def ungate_failed(self, reason: str) -> None:
        """The patch that pins and ungates a pod was refused (its reservation is reclaimed)."""
        ...

    def watch_restarted(self, resource: str, reason: str) -> None:
        """The watch ``resource`` (reservations, nodes, claims...) is started again: its
        stream ``ended`` (the server closed it), ``expired`` (410: relisted) or ``failed``."""
        ...


class NoTelemetry:
    def decision_written(self, phase: str, seconds_since_seen: float) -> None:
        pass

    def reclaimed(self, reason: str) -> None:
        pass

    def waited(self, seconds: float) -> None:
        pass

    def status_write_failed(self) -> None:
        pass

    def status_write_retried(self) -> None:
        pass

    def ungated(self, seconds: float) -> None:
        pass

    def ungate_failed(self, reason: str) -> None:
        pass

    def watch_restarted(self, resource: str, reason: str) -> None:
        pass
