"""Leadership cannot overlap (issue 11, item 5), and a clean stop hands over at once.

Two operator processes compete for a Lease on the real control plane. The
leader is frozen (SIGSTOP) past the lease duration while reservations keep
arriving; the standby takes over and decides them; the old leader is thawed
(SIGCONT). Every status write is recorded with its resourceVersion, and so is
every change of the Lease: no decision of the old leader (decision ids carry
its run id) may come after the Lease changed hands.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess

Start = Callable[..., OperatorProcess]


class Recorder(threading.Thread):
    """Records (resourceVersion, what) for Reservation statuses or Lease holders."""

    def __init__(
        self, list_call: Callable[..., Any], describe: Callable[[Any], tuple[int, str | None]]
    ) -> None:
        super().__init__(daemon=True)
        self.list_call, self.describe = list_call, describe
        self.seen: list[tuple[int, str]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                stream = watch.Watch().stream(self.list_call, timeout_seconds=5)  # type: ignore[no-untyped-call]
                for event in stream:
                    version, what = self.describe(event["object"])
                    if what is not None:
                        self.seen.append((version, what))
                    if self.stopped.is_set():
                        return
            except Exception:
                time.sleep(0.1)


@pytest.fixture
def recorders() -> Iterator[list[Recorder]]:
    started: list[Recorder] = []
    yield started
    for recorder in started:
        recorder.stopped.set()


def lease_config(namespace: str, duration: int, deadline: int, retry: float) -> dict[str, Any]:
    return {
        "leaderElection": {
            "enabled": True,
            "namespace": namespace,
            "leaseName": f"lease-{uuid.uuid4().hex[:6]}",
            "leaseDuration": f"{duration}s",
            "renewDeadline": f"{deadline}s",
            "retryPeriod": f"{retry}s",
        }
    }


def test_a_frozen_leader_writes_no_decision_after_the_standby_took_over(
    run_operator: Start,
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
    namespace: str,
    recorders: list[Recorder],
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="64Gi")
    config = lease_config(namespace, duration=4, deadline=3, retry=0.5)
    leader = run_operator(config)
    leader.wait_ready(body="ok")
    standby = run_operator(config, wait_ready=False)
    standby.wait_ready(body="standby")
    rsv.create(custom, namespace, "first", node, 256)
    first = rsv.wait_for(custom, namespace, "first")["status"]
    old_run = first["decisionID"].split("-")[0]

    coordination = client.CoordinationV1Api(core.api_client)
    holders = Recorder(
        lambda **kw: coordination.list_namespaced_lease(namespace, **kw),
        lambda lease: (  # a lambda has no return type to read: raw dicts, as for custom objects
            int(lease["metadata"]["resourceVersion"]),
            (lease.get("spec") or {}).get("holderIdentity"),
        ),
    )
    decisions = Recorder(
        lambda **kw: custom.list_namespaced_custom_object(
            "headroom.dev", "v1alpha1", namespace, "reservations", **kw
        ),
        lambda obj: (
            int(obj["metadata"]["resourceVersion"]),
            (obj.get("status") or {}).get("decisionID"),
        ),
    )
    for recorder in (holders, decisions):
        recorders.append(recorder)
        recorder.start()
    time.sleep(1)

    assert leader.popen is not None
    os.kill(leader.popen.pid, signal.SIGSTOP)
    try:
        for i in range(16):  # reservations keep arriving while the leader is frozen
            rsv.create(custom, namespace, f"during-{i}", node, 256)
            time.sleep(0.5)
        standby.wait_ready(timeout=10, body="ok")  # it took over
    finally:
        os.kill(leader.popen.pid, signal.SIGCONT)
    for i in range(5):
        rsv.create(custom, namespace, f"after-{i}", node, 256)
    assert leader.popen.wait(timeout=15) == 3  # the thawed leader saw its Lease was gone
    for name in [f"during-{i}" for i in range(16)] + [f"after-{i}" for i in range(5)]:
        assert rsv.wait_for(custom, namespace, name)["status"]["phase"] == "Admitted"
    time.sleep(1)

    old_holder = next(who for _, who in holders.seen if who)
    took_over = min(rv for rv, who in holders.seen if who and who != old_holder)
    late = [(rv, d) for rv, d in decisions.seen if d.startswith(old_run) and rv > took_over]
    assert late == [], f"the old leader wrote after the takeover (Lease rv {took_over}): {late}"
    assert any(not d.startswith(old_run) for _, d in decisions.seen), "the standby decided"


def test_a_clean_stop_releases_the_lease_so_the_standby_takes_over_at_once(
    run_operator: Start, namespace: str
) -> None:
    config = lease_config(namespace, duration=15, deadline=10, retry=0.5)
    leader = run_operator(config)
    leader.wait_ready(body="ok")
    standby = run_operator(config, wait_ready=False)
    standby.wait_ready(body="standby")
    stopped = time.monotonic()
    leader.stop()  # SIGINT: a clean shutdown, bounded in time
    assert time.monotonic() - stopped < 10, "shutdown took too long"
    # Released: free after the 5 s margin (15 − 10), not after the 15 s lease duration.
    standby.wait_ready(timeout=12, body="ok")
    assert time.monotonic() - stopped < 12
