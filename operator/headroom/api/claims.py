"""What a pod claims when it opts in to gating: its label and annotations, parsed totally.

A pod opts in with the label ``headroom.dev/claim: "true"`` (a label, so that the
webhook's ``objectSelector`` keeps the API server from calling the webhook for any
other pod) and says what it needs in annotations:

- ``headroom.dev/ram``, ``headroom.dev/vram``: a Kubernetes quantity (``8Gi``,
  ``16000Mi``, ``1.5G``) or plain MiB (``8192``), rounded *up* to whole MiB, since
  a claim must never be smaller than what was asked; at least one above 0;
- ``headroom.dev/wait``: how long the pod may wait for room (a Go duration, at most
  24h, as ``spec.wait``); absent, it waits as long as it stays gated;
- ``headroom.dev/node``: the one node it may use;
- ``headroom.dev/gpus``: over how many GPU devices its VRAM is spread (a whole
  number, 0 to 1024, as ``spec.gpus``; absent: 1).

The webhook refuses a pod whose annotations do not parse, naming the annotation and
the value; the operator reads them with the same function, so the two can never
disagree about what a pod claims.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from headroom.api.constants import (
    CLAIM_LABEL,
    GO_DURATION,
    GPUS_ANNOTATION,
    MAX_GPUS,
    MAX_MB,
    MAX_WAIT,
    NODE_ANNOTATION,
    RAM_ANNOTATION,
    VRAM_ANNOTATION,
    WAIT_ANNOTATION,
)
from headroom.api.parse import InvalidValueError, memory_mib, parse_duration, parse_int, shown

_PLAIN_MIB = re.compile(r"\d{1,10}")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True, slots=True)
class PodClaim:
    """The memory one pod claims, and where and how long it may wait for it."""

    ram_mb: int
    vram_mb: int = 0
    wait: timedelta | None = None
    node: str | None = None
    gpus: int | None = None  # None: the Reservation's default (1)


def is_claim_pod(obj: Any) -> bool:
    """Whether a pod opted in (its label is exactly ``"true"``)."""
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return isinstance(labels, dict) and labels.get(CLAIM_LABEL) == "true"


def pod_claim(obj: Any) -> PodClaim:
    """The claim of an opted-in pod; InvalidValueError names the annotation and the value."""
    annotations = ((obj or {}).get("metadata") or {}).get("annotations") or {}
    if not isinstance(annotations, dict):
        raise InvalidValueError(f"metadata.annotations: not a map: {shown(annotations)}")
    ram = _mib(annotations, RAM_ANNOTATION)
    vram = _mib(annotations, VRAM_ANNOTATION)
    if ram + vram == 0:
        raise InvalidValueError(
            f"annotation {RAM_ANNOTATION} or {VRAM_ANNOTATION}: a pod labelled "
            f'{CLAIM_LABEL}: "true" must claim more than 0 MiB of one of them '
            f"(got {shown(annotations.get(RAM_ANNOTATION))} and "
            f"{shown(annotations.get(VRAM_ANNOTATION))})"
        )
    return PodClaim(ram, vram, _wait(annotations), _node(annotations), _gpus(annotations))


def _mib(annotations: dict[str, Any], key: str) -> int:
    raw = annotations.get(key)
    if raw is None:
        return 0
    field = f"annotation {key}"
    if isinstance(raw, str) and _PLAIN_MIB.fullmatch(raw.strip()):
        mib = int(raw.strip())
        if mib > MAX_MB:
            raise InvalidValueError(f"{field}: {shown(raw)} is above {MAX_MB} MiB")
        return mib
    try:
        return memory_mib(raw, field, round_up=True)
    except InvalidValueError as error:
        raise InvalidValueError(
            f"{error} (a quantity such as 8Gi or 16000Mi, or plain MiB)"
        ) from None


def _wait(annotations: dict[str, Any]) -> timedelta | None:
    raw = annotations.get(WAIT_ANNOTATION)
    if raw is None:
        return None
    field = f"annotation {WAIT_ANNOTATION}"
    if not isinstance(raw, str) or not re.fullmatch(GO_DURATION, raw.strip()):
        raise InvalidValueError(f"{field}: not a duration (use e.g. 90s, 10m, 2h): {shown(raw)}")
    return parse_duration(raw.strip(), field, low=timedelta(seconds=1), high=MAX_WAIT)


def _node(annotations: dict[str, Any]) -> str | None:
    raw = annotations.get(NODE_ANNOTATION)
    if raw is None:
        return None
    if not isinstance(raw, str) or len(raw) > 253 or not _DNS_SUBDOMAIN.fullmatch(raw):
        raise InvalidValueError(f"annotation {NODE_ANNOTATION}: not a Node name: {shown(raw)}")
    return raw


def _gpus(annotations: dict[str, Any]) -> int | None:
    raw = annotations.get(GPUS_ANNOTATION)
    if raw is None:
        return None
    return parse_int(raw, f"annotation {GPUS_ANNOTATION}", 0, MAX_GPUS)
