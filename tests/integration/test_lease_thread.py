"""The Lease is renewed on its own thread: a main loop busy past renew_deadline keeps it.

Seen in CI (R5 of the chaos suite): a standby took over while 800 reservations
poured in, its event loop stayed full for seconds, a renewal queued behind the
work missed renew_deadline, and the new leader exited with nobody left to decide.
Here the main loop is blocked outright, longer than the whole lease, against the
real API server: the Lease must still be renewed and the holder may still act.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta

from kubernetes import client

from headroom.kube.clock import SystemClock
from headroom.kube.leader import LeaseSettings
from headroom.kube.leasethread import LeaseThread
from headroom_dev.controlplane import ControlPlane


def settings(namespace: str, identity: str) -> LeaseSettings:
    return LeaseSettings(
        namespace=namespace,
        name=f"lease-{uuid.uuid4().hex[:6]}",
        identity=identity,
        lease_duration=timedelta(seconds=2),
        renew_deadline=timedelta(seconds=1.5),
        retry_period=timedelta(seconds=0.2),
    )


def lease_spec(coordination: client.CoordinationV1Api, lease: LeaseSettings) -> client.V1LeaseSpec:
    spec = coordination.read_namespaced_lease(lease.name, lease.namespace).spec
    assert spec is not None
    return spec


async def test_a_blocked_main_loop_does_not_lose_the_lease(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    coordination = client.CoordinationV1Api(api_client)
    lease = settings(namespace, "busy-leader")
    lost: list[bool] = []
    keeper = LeaseThread(control_plane.admin_credentials(), lease, SystemClock())
    await keeper.acquire(on_lost=lambda: lost.append(True))
    held = asyncio.create_task(keeper.held())
    before = lease_spec(coordination, lease).renew_time

    time.sleep(3.0)  # noqa: ASYNC251 - the main loop blocked for longer than the whole lease

    assert keeper.may_act(), "the lease thread stopped renewing while the main loop was busy"
    assert lease_spec(coordination, lease).renew_time != before
    assert not lost
    assert not held.done()

    await keeper.release()
    await asyncio.wait_for(held, 5)
    spec = lease_spec(coordination, lease)
    assert spec.holder_identity in ("", None), "a clean stop hands the Lease over"
    assert not keeper.may_act()


async def test_a_standby_stopped_while_waiting_leaves_cleanly(
    control_plane: ControlPlane, namespace: str
) -> None:
    lease = settings(namespace, "first")
    first = LeaseThread(control_plane.admin_credentials(), lease, SystemClock())
    await first.acquire(on_lost=lambda: None)
    second = LeaseThread(
        control_plane.admin_credentials(),
        LeaseSettings(**{**lease.__dict__, "identity": "second"}),
        SystemClock(),
    )
    waiting = asyncio.create_task(second.acquire(on_lost=lambda: None))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    assert not second.may_act()

    waiting.cancel()  # SIGTERM to a standby
    await asyncio.gather(waiting, return_exceptions=True)
    assert first.may_act()
    await first.release()


async def test_a_renewal_the_leader_did_not_see_land_does_not_block_the_release(
    control_plane: ControlPlane, api_client: client.ApiClient, namespace: str
) -> None:
    """A stop cancels a renewal already on the wire: the API server applied it, the
    leader never saw its answer, and the release (a PUT with the last resourceVersion
    the leader saw) met 409. The standby then waited out the whole lease on a rolling
    update. Here the Lease moves behind the leader's back the same way."""
    coordination = client.CoordinationV1Api(api_client)
    lease = settings(namespace, "leader")
    lease = LeaseSettings(**{**lease.__dict__, "retry_period": timedelta(seconds=30)})
    keeper = LeaseThread(control_plane.admin_credentials(), lease, SystemClock())
    await keeper.acquire(on_lost=lambda: None)
    moved = {"metadata": {"annotations": {"renewal": "landed-unseen"}}}
    coordination.patch_namespaced_lease(lease.name, lease.namespace, moved)

    await keeper.release()
    spec = lease_spec(coordination, lease)
    assert spec.holder_identity in ("", None), "the release gave up on a conflict"
