"""References to API objects, as an Event's ``involvedObject`` names them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about."""

    api_version: str
    kind: str
    name: str
    uid: str
    namespace: str | None = None
