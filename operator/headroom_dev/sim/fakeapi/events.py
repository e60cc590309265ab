"""Kubernetes Events posted to the fake: counted, the last few kept per object.

Thousands of simulations each post thousands of Events; nothing reads them back
through the API, so they are not stored as objects. A checker asks what was said
about one object (:meth:`EventLog.about`) or how often (:attr:`EventLog.by_reason`).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from headroom.kube.transport import ApiError

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One posted Event, reduced to what assertions need."""

    reason: str
    message: str
    type: str
    kind: str
    namespace: str
    name: str
    uid: str
    at: str


class EventLog:
    """The count of Events and the last ``keep`` per involved object."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self.count = 0
        self.by_reason: Counter[str] = Counter()
        self._recent: dict[tuple[str, str, str], deque[EventRecord]] = {}

    def record(self, event: JSON) -> EventRecord:
        involved = event.get("involvedObject")
        if type(involved) is not dict:
            raise ApiError(422, "Invalid", "Event is invalid: involvedObject: Required value")
        namespace = event["metadata"]["namespace"]
        if involved.get("namespace") not in (None, "", namespace):
            raise ApiError(
                422,
                "Invalid",
                f'Event "{event["metadata"]["name"]}" is invalid: involvedObject.namespace: '
                f'Invalid value: "{involved.get("namespace")}": does not match event.namespace',
            )
        record = EventRecord(
            reason=str(event.get("reason", "")),
            message=str(event.get("message", "")),
            type=str(event.get("type", "")),
            kind=str(involved.get("kind", "")),
            namespace=str(involved.get("namespace") or ""),
            name=str(involved.get("name", "")),
            uid=str(involved.get("uid", "")),
            at=str(event["metadata"].get("creationTimestamp", "")),
        )
        self.count += 1
        self.by_reason[record.reason] += 1
        key = (record.kind, record.namespace, record.name)
        recent = self._recent.get(key)
        if recent is None:
            recent = self._recent[key] = deque(maxlen=self.keep)
        recent.append(record)
        return record

    def about(self, kind: str, namespace: str | None, name: str) -> list[EventRecord]:
        """The last few Events whose involvedObject is this object, oldest first."""
        return list(self._recent.get((kind, namespace or "", name), ()))
