"""The operator's log lines: text for a person at a terminal, JSON for a log pipeline.

Why JSON: a platform team ships logs to Loki or Elasticsearch and asks "what
happened to reservation ml/train-7", which a regular expression over free text
answers badly. A line about one reservation carries it as fields (namespace,
name, uid, node) through :func:`about`; every other line still carries time,
level, logger and message. Any line, a library's or a traceback's, is one JSON
object: a pipeline never has to guess where a record ends.

Process-wide and outside the layers (as :mod:`headroom.main`): the control code
only attaches fields with :func:`about`, and the command line picks the format.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Literal

FORMATS = ("text", "json")
Format = Literal["text", "json"]
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_FIELDS = ("namespace", "name", "uid", "node")


def about(
    namespace: str, name: str, uid: str | None = None, node: str | None = None
) -> dict[str, Any]:
    """``extra=`` for a log call about one reservation: its identity as fields."""
    fields = {"namespace": namespace, "name": name, "uid": uid, "node": node}
    return {"reservation": {k: v for k, v in fields.items() if v}}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (RFC 3339, UTC), level, logger, message, the
    reservation's fields when the line is about one, and the exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        reservation = getattr(record, "reservation", None)
        if isinstance(reservation, dict):
            line.update({k: str(reservation[k]) for k in _FIELDS if reservation.get(k)})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # ASCII: any text (a lone surrogate from a bad byte, say) stays valid JSON.
        return json.dumps(line, default=str)


def configure(level: str, log_format: Format) -> None:
    """Set up the root logger once, for the whole process (kopf's lines included)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
