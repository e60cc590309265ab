"""The leader's Lease says where its webhook answers; the others read it, the leader not."""

from __future__ import annotations

import asyncio
import copy
from datetime import timedelta
from typing import Any, cast

from headroom.api.constants import WEBHOOK_URL_ANNOTATION
from headroom.kube.leader import LeaderElector, LeaseSettings
from headroom.kube.transport import ApiError, Transport


class Leases:
    """Just enough of the API for a Lease: get, create, replace with resourceVersion."""

    def __init__(self) -> None:
        self.stored: dict[str, Any] = {}
        self.version = 0

    async def get(self, path: str) -> Any:
        if path not in self.stored:
            raise ApiError(404, "NotFound", path)
        return copy.deepcopy(self.stored[path])

    async def create(self, path: str, body: Any) -> Any:
        return self._store(f"{path}/{body['metadata']['name']}", body)

    async def replace(self, path: str, body: Any) -> Any:
        if (
            body["metadata"].get("resourceVersion")
            != self.stored[path]["metadata"]["resourceVersion"]
        ):
            raise ApiError(409, "Conflict", path)
        return self._store(path, body)

    def _store(self, path: str, body: Any) -> Any:
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.stored[path] = stored
        return copy.deepcopy(stored)


def settings(identity: str, **annotations: str) -> LeaseSettings:
    return LeaseSettings(
        namespace="ops",
        name="headroom",
        identity=identity,
        lease_duration=timedelta(seconds=15),
        renew_deadline=timedelta(seconds=10),
        retry_period=timedelta(seconds=2),
        annotations={WEBHOOK_URL_ANNOTATION: annotations["url"]} if annotations else {},
    )


def test_the_standby_reads_the_leaders_url_and_the_leader_does_not_forward_to_itself() -> None:
    async def scenario() -> None:
        leases = cast(Transport, Leases())
        leader = LeaderElector(leases, settings("a", url="https://10.0.0.1:9443"))
        standby = LeaderElector(leases, settings("b", url="https://10.0.0.2:9443"))
        assert await leader._attempt(bounded_by=5)
        assert not await standby._attempt(bounded_by=5)
        assert standby.leader_annotation(WEBHOOK_URL_ANNOTATION) == "https://10.0.0.1:9443"
        assert leader.leader_annotation(WEBHOOK_URL_ANNOTATION) is None
        await leader.release()  # no holder: no one to forward to
        assert not await standby._attempt(bounded_by=5)  # the margin is not over yet
        assert standby.leader_annotation(WEBHOOK_URL_ANNOTATION) is None

    asyncio.run(scenario())


def test_a_leader_with_nothing_to_advertise_writes_no_annotation() -> None:
    async def scenario() -> None:
        leases = Leases()
        leader = LeaderElector(cast(Transport, leases), settings("a"))
        assert await leader._attempt(bounded_by=5)
        (lease,) = leases.stored.values()
        assert "annotations" not in lease["metadata"]

    asyncio.run(scenario())
