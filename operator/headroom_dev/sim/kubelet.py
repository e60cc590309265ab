"""What the kubelet writes of a pod in the simulation: its phase, and its end at its
active deadline. Both pod worlds (:mod:`.pods`, :mod:`.scheduled`) run their pods
through it, so they end them alike."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from headroom.kube.transport import ApiError
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.podfacts import finished

JSON = dict[str, Any]


def set_phase(
    server: FakeApiServer, path: str, uid: str, phase: str, reason: str | None = None
) -> bool:
    """The pod at ``path``, that incarnation and not ended, gets ``phase``: whether it did."""
    pod = server.get(path)
    if pod is None or pod["metadata"]["uid"] != uid or finished(pod):
        return False
    status: JSON = {"phase": phase, **({"reason": reason} if reason else {})}
    with contextlib.suppress(ApiError):
        server.merge_patch(path + "/status", {"status": status})
        return True
    return False


async def end_at_deadline(server: FakeApiServer, path: str, uid: str) -> bool:
    """Failed, ``DeadlineExceeded``, once its active deadline, counted from its start
    (now), passes: whether it ended it (nothing here sets a deadline after the start)."""
    pod = server.get(path)
    deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds") if pod else None
    if deadline is None:
        return False
    await asyncio.sleep(deadline)
    return set_phase(server, path, uid, "Failed", reason="DeadlineExceeded")
