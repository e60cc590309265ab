"""The simulation's clocked promises over gated pods catch what they are meant to catch.

A checker that never fails proves nothing: each promise of
``headroom_dev.sim.podpromises`` is shown here breaking on a history made by hand
(and holding on the same history done right).
"""

from __future__ import annotations

from typing import Any

from headroom_dev.sim.podpromises import RESYNC, SLACK, PodPromises, condition_wrong

JSON = dict[str, Any]
GATE = {"name": "headroom.dev/admission"}
POD_UID = "pod-uid-1"


def pod(*, gated: bool = True, condition: tuple[str, str] | None = None, ram: str = "1Gi") -> JSON:
    spec: JSON = {"containers": [{"name": "main"}]}
    if gated:
        spec["schedulingGates"] = [GATE]
    else:
        pin = {"key": "metadata.name", "operator": "In", "values": ["node-0"]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [pin]}]
                }
            }
        }
    conditions = []
    if condition is not None:
        status, reason = condition
        conditions.append({"type": "headroom.dev/Admitted", "status": status, "reason": reason})
    return {
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "sim",
            "uid": POD_UID,
            "labels": {"headroom.dev/claim": "true"},
            "annotations": {"headroom.dev/ram": ram},
        },
        "spec": spec,
        "status": {"phase": "Pending", "conditions": conditions},
    }


def reservation(phase: str | None, reason: str | None = None, *, ram: int = 1024) -> JSON:
    return {
        "kind": "Reservation",
        "metadata": {
            "name": "p",
            "namespace": "sim",
            "uid": f"rsv-{phase}-{reason}",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "uid": POD_UID}],
        },
        "spec": {"node": "node-0", "ramMB": ram, "owner": {"pod": "p"}, "liveness": "Pod"},
        "status": {"phase": phase, "reason": reason} if phase else {},
    }


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def promises(clock: Clock, failures: list[str]) -> PodPromises:
    return PodPromises(failures.append, lambda _: None, clock, steady_since=lambda: 0.0)


def test_a_gated_pods_condition_must_say_what_its_reservation_calls_for() -> None:
    assert condition_wrong(pod(), None) is not None  # gated, silent
    assert condition_wrong(pod(condition=("False", "NoNode")), None) is None
    queued = reservation("Queued", "InsufficientRAM")
    assert condition_wrong(pod(condition=("False", "Waiting")), queued) is None
    assert condition_wrong(pod(condition=("False", "NoNode")), queued) is not None
    refused = reservation("Rejected", "WaitTimeout")
    assert condition_wrong(pod(condition=("False", "WaitTimeout")), refused) is None
    assert condition_wrong(pod(condition=("False", "Waiting")), refused) is not None
    # Made for another size: what it says then is not judged here, only that it is False.
    assert condition_wrong(pod(condition=("False", "Whatever"), ram="2Gi"), queued) is None
    assert condition_wrong(pod(condition=("False", "X"), ram="banana"), None) is not None
    assert condition_wrong(pod(condition=("False", "BadClaim"), ram="banana"), None) is None
    admitted = reservation("Admitted", "Fits")
    assert condition_wrong(pod(gated=False, condition=("True", "Admitted")), admitted) is None
    assert condition_wrong(pod(gated=False, condition=("False", "Waiting")), admitted)


def test_a_pod_gated_past_a_resync_on_an_admitted_reservation_is_caught() -> None:
    clock, failures = Clock(), []
    watch = promises(clock, failures)
    watch.reservation_changed("MODIFIED", reservation("Admitted", "Fits"), pod())
    clock.t = RESYNC + SLACK - 1
    watch.judge({}, {})
    assert failures == []
    clock.t = RESYNC + SLACK + 1
    watch.judge({}, {})
    assert len(failures) == 1
    assert "gated" in failures[0]

    clock, failures = Clock(), []
    watch = promises(clock, failures)
    watch.reservation_changed("MODIFIED", reservation("Admitted", "Fits"), pod())
    clock.t = 2.0
    watch.ungated(POD_UID)  # in time
    clock.t = 100.0
    watch.judge({}, {})
    assert failures == []


def test_a_create_delete_loop_is_caught_but_a_backed_off_retry_is_not() -> None:
    clock, failures = Clock(), []
    watch = promises(clock, failures)
    for second in range(4):  # one a second, nothing moved: a loop
        clock.t = float(second)
        watch.reservation_changed("ADDED", reservation(None), pod())
    assert failures
    assert "create/delete loop" in failures[0]

    clock, failures = Clock(), []
    watch = promises(clock, failures)
    for at in (0.0, 10.0, 30.0, 70.0, 150.0):  # after each refusal, the backoff doubles
        clock.t = at
        watch.reservation_changed("ADDED", reservation(None), pod())
    assert failures == []


def test_nothing_is_made_for_a_pod_after_its_quotas_lifetime_ran_out() -> None:
    clock, failures = Clock(), []
    watch = promises(clock, failures)
    watch.reservation_changed("ADDED", reservation(None), pod())
    watch.reservation_changed("MODIFIED", reservation("Reclaimed", "Expired"), pod(gated=False))
    clock.t = 100.0
    watch.moved()  # whatever moved since
    watch.reservation_changed("ADDED", reservation(None), pod(gated=False))
    assert len(failures) == 1
    assert "lifetime" in failures[0]


def test_a_pod_whose_reservation_ran_out_while_still_gated_may_be_placed_again() -> None:
    """It never left the gate on that lifetime (its ungate was not sent in time): the
    lifetime ran nothing, and the pod is placed again as after any refusal."""
    clock, failures = Clock(), []
    watch = promises(clock, failures)
    watch.reservation_changed("ADDED", reservation(None), pod())
    watch.reservation_changed("MODIFIED", reservation("Reclaimed", "Expired"), pod())
    clock.t = 10.0  # the pod's backoff after a refusal
    watch.reservation_changed("ADDED", reservation(None), pod())
    watch.reservation_changed("MODIFIED", reservation("Admitted", "Fits"), pod())
    watch.reservation_changed("MODIFIED", reservation("Reclaimed", "Expired"), pod(gated=False))
    clock.t = 100.0
    watch.reservation_changed("ADDED", reservation(None), pod(gated=False))  # not again
    assert len(failures) == 1
    assert "lifetime" in failures[0]


def test_a_settled_pods_wrong_condition_is_caught_after_a_restart() -> None:
    clock, failures = Clock(), []
    watch = promises(clock, failures)
    silent = pod()
    watch.pod_changed(("sim", "p"), None, silent)
    clock.t = RESYNC + SLACK + 1
    watch.judge({("sim", "p"): silent}, {})
    assert len(failures) == 1
    assert "settled" in failures[0]
    watch.judge({("sim", "p"): silent}, {})
    assert len(failures) == 1  # judged once per change
