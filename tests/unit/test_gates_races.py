"""Races of gated pods the simulation found, each replayed on the fake API server.

The controller's watches are off: each test delivers the events itself, and withholds
or delays the one that makes the race.

- A claiming pod deleted and created again under its name, its deletion never seen
  (seed 4576 of the first schedules with gated pods): the new pod's reservation was
  taken for the old pod's (its owner read by name from the owner-pod cache, which
  still held the old incarnation), then reclaimed as "owner pod was replaced", and
  the new pod ran holding nothing. A gated pod's reservation names its owner's
  incarnation in its ownerReference; that is the owner.
- A foreign gate lifted by another controller while the operator's view of the pod
  still had it (seed 2818): the ungate patch, made from that view, failed its
  ``test`` of our gate's index, and was taken for a refusal (the reservation
  reclaimed ``UngateRefused``, the pod's place in the queue lost, a Warning shown).
- A claiming pod that ended before its reservation was decided (seed 5786: it
  ended while the operator was down): the gates reclaimed the reservation the
  moment its Admitted status was confirmed, and the confirmation then announced and
  released that reclaim as if it were written, so its memory went to another
  reservation while the API still showed this one Admitted.
- A late owner-watch event of the old incarnation (seed 4093): the old pod's
  MODIFIED came after the new pod's reservation was decided, and was taken for the
  new pod being replaced: the new pod's reservation reclaimed, the pod running
  holding nothing. The pod is read before a reservation goes.
- A pod that ended before its reservation was decided, on a node then unknown
  (seed 4531): the reservation was queued (NodeUnknown, 24 h) and stayed so, for a
  pod that had ended; had the node come back it would have been admitted. A pod
  that ended has its waiting reservation deleted.
- A watch event that lags a newer list (seed 5886): the pod the webhook missed was
  listed bound, its reservation made on its node, then the watch delivered its
  older ADDED (not yet bound), and the admission, reading that, queued the claim
  of a pod already running there behind its own memory request: for ever.
- Owner-label patches that return out of order (seen on the real control plane under
  load, test_pods_wait_gated_in_creation_order_and_go_when_one_finishes): each pod
  was labelled before it queued for the placement lock, so the third pod's
  reservation was made, and admitted, before the second's. A pod is labelled under
  the lock, in the order the pods came.
- A claiming pod bound while the operator was down, the webhook having missed it
  (seed 2843): at the restart the decider admitted a tenant's reservation into the
  namespace's quota before the pod's own reservation was made and recorded, so the
  quota held both. A pod that runs with no decision about its reservation counts
  against its quotas from the rebuild on (``Ledger.set_running_claim``).
- An ungate patch that failed until its reservation's lifetime (a quota's, 5 s) ran
  out (seed 9270): the retry loop sent the patch built from the admission 4 s after
  the operator had reclaimed it ``Expired``, and the pod left the gate on a claim no
  longer admitted. Every attempt is made only while the ledger still admits the pod
  with a second of the lifetime left; the pod stays gated and is placed again.
- Then a reservation admitted from its queue 0.19 s before its lifetime's end (seed
  9224): it is not let out on it either (it would have had 1 s, the API server's
  shortest deadline, from its start); the pod is placed again.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from headroom.api.claims import pod_claim
from headroom.api.config import OperatorConfig
from headroom.api.constants import (
    CLAIM_LABEL,
    OWNER_LABEL,
    RAM_ANNOTATION,
    SCHEDULING_GATE,
    WAIT_ANNOTATION,
)
from headroom.control.controller import Controller
from headroom.kube.transport import JSON, ApiUnavailableError, Transport, resource_path
from headroom.objects.pods import pod_reservation
from headroom_dev import quotas as hq
from headroom_dev.sim.fakeapi import FakeApiServer
from headroom_dev.sim.loop import DEFAULT_EPOCH, VirtualClock, run_virtual

NS = "ml"
PODS = resource_path("", "v1", "pods", NS)
FOREIGN = "example.com/quota"
QUOTAS = resource_path("headroom.dev", "v1alpha1", "headroomquotas")


def start(server: FakeApiServer) -> Controller:
    return Controller(
        OperatorConfig(), server.client("operator"), clock=VirtualClock(), follow_watches=False
    )


async def deliver_reservations(server: FakeApiServer, controller: Controller) -> None:
    """What the reservation watch would say, for a few seconds."""
    for _ in range(3):
        await asyncio.sleep(1)
        for reservation in server.reservations(NS):
            controller.reservations.on_event("MODIFIED", reservation)


def claim_pod(*gates: str, **annotations: str) -> JSON:
    """The body of a claiming pod ``p`` of 512Mi, behind ``gates``, with more annotations."""
    return {
        "metadata": {
            "name": "p",
            "labels": {CLAIM_LABEL: "true", OWNER_LABEL: "true"},
            "annotations": {RAM_ANNOTATION: "512Mi", **annotations},
        },
        "spec": {
            "containers": [{"name": "main", "image": "sim"}],
            "schedulingGates": [{"name": gate} for gate in gates],
        },
    }


def bound_pod(server: FakeApiServer, node: str, ram: str = "512Mi", request: str = "") -> JSON:
    """A claiming pod the webhook missed (no gate), bound by the scheduler."""
    container: JSON = {"name": "main", "image": "sim"}
    if request:
        container["resources"] = {"requests": {"memory": request}}
    body = {
        "metadata": {
            "name": "p",
            "labels": {CLAIM_LABEL: "true", OWNER_LABEL: "true"},
            "annotations": {RAM_ANNOTATION: ram},
        },
        "spec": {"containers": [container]},
    }
    pod = server.create(PODS, body)
    binding = {"metadata": {"name": "p", "uid": pod["metadata"]["uid"]}, "target": {"name": node}}
    server.create(f"{PODS}/p/binding", binding)
    found = server.get(f"{PODS}/p")
    assert found is not None
    return found


def test_the_new_pods_reservation_is_its_own_though_the_old_pods_deletion_was_missed() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        old = bound_pod(server, "n1")
        controller = start(server)
        await controller.start()  # lists the old pod: its reservation is made
        await deliver_reservations(server, controller)
        [first] = server.reservations(NS)
        assert first["status"]["phase"] == "Admitted"
        server.delete(f"{PODS}/p")  # its DELETED reaches no one
        new = bound_pod(server, "n1")
        assert new["metadata"]["uid"] != old["metadata"]["uid"]
        controller.gates.on_event("ADDED", new)  # the old reservation goes, a new one comes
        await asyncio.sleep(1)
        controller.reservations.on_event("DELETED", first)
        await deliver_reservations(server, controller)
        controller.owners.on_event("MODIFIED", new)  # the owner watch sees the new pod
        await deliver_reservations(server, controller)
        [second] = server.reservations(NS)
        owner = second["metadata"]["ownerReferences"][0]["uid"]
        assert owner == new["metadata"]["uid"]
        assert (second["status"]["phase"], second["status"]["reason"]) == ("Admitted", "Fits")
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_a_late_event_of_the_old_pod_does_not_release_the_new_pods_reservation() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        old = bound_pod(server, "n1")
        controller = start(server)
        await controller.start()
        await deliver_reservations(server, controller)
        [first] = server.reservations(NS)
        server.delete(f"{PODS}/p")
        new = bound_pod(server, "n1")
        controller.gates.on_event("DELETED", old)
        controller.owners.on_event("DELETED", old)
        controller.gates.on_event("ADDED", new)
        await asyncio.sleep(1)
        controller.reservations.on_event("DELETED", first)
        controller.owners.on_event("ADDED", new)
        await deliver_reservations(server, controller)
        controller.owners.on_event("MODIFIED", old)  # late, from a watch behind a list
        await deliver_reservations(server, controller)
        [second] = server.reservations(NS)
        assert second["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"]
        assert second["status"]["phase"] == "Admitted"
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_an_ungate_made_from_a_stale_view_is_made_again_not_taken_for_a_refusal() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        server.create(PODS, claim_pod(FOREIGN, SCHEDULING_GATE))
        controller = start(server)
        await controller.start()  # sees both gates: our gate is at index 1
        # The quota controller lifts its gate; the claim watch has not said so yet.
        server.merge_patch(f"{PODS}/p", {"spec": {"schedulingGates": [{"name": SCHEDULING_GATE}]}})
        await deliver_reservations(server, controller)  # admitted, then ungated
        [reservation] = server.reservations(NS)
        assert (reservation["status"]["phase"], reservation["status"]["reason"]) == (
            "Admitted",
            "Fits",
        )
        pod = server.get(f"{PODS}/p")
        assert pod is not None
        assert "schedulingGates" not in pod["spec"]
        assert pod["metadata"]["annotations"]["headroom.dev/reservation"] == "p"
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_a_reclaim_decided_while_an_admission_is_confirmed_keeps_the_memory_until_written() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        pod = bound_pod(server, "n1")
        # Its reservation, made before the operator went down, is not decided yet.
        body = pod_reservation(pod, pod_claim(pod), "n1")
        server.create(resource_path("headroom.dev", "v1alpha1", "reservations", NS), body)
        server.merge_patch(f"{PODS}/p/status", {"status": {"phase": "Succeeded"}})
        controller = start(server)
        held_when_reclaimed: list[bool] = []

        def on_change(event_type: str, obj: JSON) -> None:
            if (obj.get("status") or {}).get("phase") == "Reclaimed":
                held_when_reclaimed.append(controller.state.ledger.get(f"{NS}/p") is not None)

        server.subscribe(on_change)
        await controller.start()  # admits it (the pod ended: nothing says where it runs)...
        await deliver_reservations(server, controller)  # ...and reclaims it
        [reservation] = server.reservations(NS)
        assert (reservation["status"]["phase"], reservation["status"]["reason"]) == (
            "Reclaimed",
            "OwnerPodFinished",
        )
        assert held_when_reclaimed[:1] == [True]  # released only once the object says so
        assert controller.state.ledger.get(f"{NS}/p") is None
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_a_watch_event_older_than_the_list_does_not_unbind_a_running_pod() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=4096)  # a limit of 3072 MiB
        pod = bound_pod(server, "n1", ram="2048Mi", request="2048Mi")
        unbound = dict(pod, spec={k: v for k, v in pod["spec"].items() if k != "nodeName"})
        controller = start(server)
        await controller.start()  # lists it bound: its reservation is made on n1
        await asyncio.sleep(1)
        controller.gates.on_event("ADDED", unbound)  # the watch, late, shows it as created
        await deliver_reservations(server, controller)
        [reservation] = server.reservations(NS)
        # It runs there: recorded, over the limit if it must be, never queued behind
        # its own memory request.
        assert reservation["status"]["phase"] == "Admitted"
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_the_waiting_reservation_of_a_pod_that_ended_is_deleted() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        pod = bound_pod(server, "n9")  # its node is gone (or not known yet)
        body = pod_reservation(pod, pod_claim(pod), "n9")  # made before the operator went down
        server.create(resource_path("headroom.dev", "v1alpha1", "reservations", NS), body)
        server.merge_patch(f"{PODS}/p/status", {"status": {"phase": "Failed"}})
        queued: list[str] = []
        server.subscribe(
            lambda event_type, obj: (
                queued.append(obj["metadata"]["name"])
                if (obj.get("status") or {}).get("phase") == "Queued"
                else None
            )
        )
        controller = start(server)
        await controller.start()  # decided: it waits for node n9...
        await deliver_reservations(server, controller)
        assert set(queued) == {"p"}
        assert server.reservations(NS) == []  # ...for a pod that has ended: deleted
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


class SlowPatchesOf:
    """The operator's transport, with every patch of one path answered late."""

    def __init__(self, inner: Transport, path: str, delay: float) -> None:
        self._inner, self._path, self._delay = inner, path, delay

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        if path == self._path:
            await asyncio.sleep(self._delay)
        return await self._inner.json_patch(path, operations)


def test_pods_are_reserved_in_the_order_they_came_whatever_their_label_patches_take() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=4096)  # a limit of 3072 MiB: room for two of three
        for name in ("job-0", "job-1", "job-2"):  # not labelled as owners yet
            body = {
                "metadata": {
                    "name": name,
                    "labels": {CLAIM_LABEL: "true"},
                    "annotations": {RAM_ANNOTATION: "1536Mi"},
                },
                "spec": {
                    "containers": [{"name": "main", "image": "sim"}],
                    "schedulingGates": [{"name": SCHEDULING_GATE}],
                },
            }
            server.create(PODS, body)
            await asyncio.sleep(1)  # created a second apart
        transport = SlowPatchesOf(server.client("operator"), f"{PODS}/job-1", delay=3.0)
        controller = Controller(
            OperatorConfig(), transport, clock=VirtualClock(), follow_watches=False
        )
        await controller.start()
        await asyncio.sleep(5)  # every patch answered
        await deliver_reservations(server, controller)
        phases = {r["metadata"]["name"]: r["status"]["phase"] for r in server.reservations(NS)}
        assert phases == {"job-0": "Admitted", "job-1": "Admitted", "job-2": "Queued"}
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_a_pod_bound_while_the_operator_was_down_fills_its_quota_before_any_decision() -> None:
    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        name = {"kubernetes.io/metadata.name": NS}
        server.create(QUOTAS, hq.quota("q", name, ramMB=1024))
        # While the operator is down: a claiming pod the webhook missed is bound (its
        # reservation not made yet), and a tenant asks for the rest of the quota.
        bound_pod(server, "n1", ram="1024Mi")
        server.create_reservation(NS, "r", "n1", 512, wait="10m")
        controller = start(server)
        await controller.start()
        await asyncio.sleep(1)  # the decider decides r; the pod's reservation is not seen yet
        await deliver_reservations(server, controller)
        found = {r["metadata"]["name"]: r["status"] for r in server.reservations(NS)}
        assert (found["p"]["phase"], found["p"]["reason"]) == ("Admitted", "Fits")
        assert (found["r"]["phase"], found["r"]["reason"]) == ("Queued", "QuotaExceeded")
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


class UnreachablePod:
    """The operator's transport, with the patches of one pod failing (no answer) while
    ``down``; when each was sent, and whether it went through."""

    def __init__(self, inner: Transport, path: str) -> None:
        self._inner, self._path = inner, path
        self.down = True
        self.sent: list[tuple[float, bool]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        if path == self._path:
            self.sent.append((asyncio.get_running_loop().time(), not self.down))
            if self.down:
                raise ApiUnavailableError("connection refused")
        return await self._inner.json_patch(path, operations)


def test_an_ungate_retried_past_its_reservations_lifetime_is_not_sent() -> None:
    """Seed 9270: the pod's reservation was admitted with its quota's 5 s lifetime, the
    ungate patch failed until after it expired, and the retry, built from the admission
    and sent 4 s after the reservation was reclaimed, let the pod out on a claim no
    longer admitted (it then ran with no reservation at all)."""

    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=8192)
        name = {"kubernetes.io/metadata.name": NS}
        server.create(QUOTAS, hq.quota("q", name, defaultLifetime="5s"))
        server.create(PODS, claim_pod(SCHEDULING_GATE))
        # What the reservation said when the pod left the gate (uid, phase, reason).
        let_out: list[tuple[str, str, str]] = []

        made_again: list[float] = []  # when a second reservation was made

        def on_change(event_type: str, obj: JSON) -> None:
            if obj.get("kind") == "Reservation" and event_type == "ADDED":
                made_again.append(asyncio.get_running_loop().time())
            if obj.get("kind") != "Pod" or obj["spec"].get("schedulingGates") or let_out:
                return
            [reservation] = server.reservations(NS)
            status = reservation.get("status") or {}
            let_out.append((reservation["metadata"]["uid"], status["phase"], status["reason"]))

        server.subscribe(on_change)
        transport = UnreachablePod(server.client("operator"), f"{PODS}/p")
        controller = Controller(
            OperatorConfig(), transport, clock=VirtualClock(), follow_watches=False
        )
        await controller.start()
        await deliver_reservations(server, controller)  # admitted; the ungate fails
        [first] = server.reservations(NS)
        assert (first["status"]["phase"], first["status"]["reason"]) == ("Admitted", "Fits")
        expiry = datetime.fromisoformat(first["status"]["expiresAt"])
        lifetime_end = (expiry - DEFAULT_EPOCH).total_seconds()  # in virtual seconds
        while (server.reservations(NS)[0]["status"]["phase"] == "Admitted") and (
            asyncio.get_running_loop().time() < lifetime_end + 30
        ):
            await deliver_reservations(server, controller)  # expires; Reclaimed written
        [expired] = server.reservations(NS)
        assert (expired["status"]["phase"], expired["status"]["reason"]) == ("Reclaimed", "Expired")
        assert let_out == []
        transport.down = False  # the pod can be reached again: a retry would go through
        for _ in range(10):  # the pod's backoff after a refusal: 10 s
            await deliver_reservations(server, controller)
        # The pod left the gate once, on a reservation Admitted then: a new one.
        assert len(let_out) == 1
        uid, phase, reason = let_out[0]
        assert (phase, reason) == ("Admitted", "Fits")
        assert uid != first["metadata"]["uid"]
        # No attempt was sent for the first admission with less than a second of its
        # lifetime left, nor after.
        assert len(made_again) == 2
        first_tries = [at for at, _ in transport.sent if at < made_again[1]]
        assert first_tries
        assert max(first_tries) <= lifetime_end - 1
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


def test_an_admission_with_under_a_second_of_lifetime_left_lets_nothing_out() -> None:
    """Seed 9224: a pod's reservation waited in its node's queue while its quota's
    lifetime ran, and was admitted 0.19 s before its end. Let out then, the pod would
    have been given the API server's shortest deadline, 1 s, counted from its start:
    more than its claim had, for nothing. It stays gated and is placed again."""

    async def scenario() -> None:
        server = FakeApiServer(seed=5)
        server.ensure_namespace(NS)
        server.put_node("n1", memory=4096)  # a limit of 3072 MiB
        name = {"kubernetes.io/metadata.name": NS}
        server.create(QUOTAS, hq.quota("q", name, defaultLifetime="5s"))
        server.create_reservation("other", "filler", "n1", 3072)  # no quota: no lifetime
        server.create(PODS, claim_pod(SCHEDULING_GATE, **{WAIT_ANNOTATION: "1m"}))
        let_out: list[tuple[str, str]] = []  # the reservation's uid and phase then
        sent: list[float] = []  # when a patch of the pod (an ungate) was sent

        def on_change(event_type: str, obj: JSON) -> None:
            if obj.get("kind") != "Pod" or obj["spec"].get("schedulingGates") or let_out:
                return
            [reservation] = server.reservations(NS)
            let_out.append((reservation["metadata"]["uid"], reservation["status"]["phase"]))

        server.subscribe(on_change)
        transport = PatchesOf(server.client("operator"), f"{PODS}/p", sent)
        controller = Controller(
            OperatorConfig(), transport, clock=VirtualClock(), follow_watches=False
        )
        await controller.start()
        for reservation in server.reservations("other"):
            controller.reservations.on_event("ADDED", reservation)
        await deliver_reservations(server, controller)
        [first] = server.reservations(NS)
        assert first["status"]["phase"] == "Queued"
        # Its lifetime runs from its creation, while it waits.
        created = datetime.fromisoformat(first["metadata"]["creationTimestamp"])
        lifetime_end = (created - DEFAULT_EPOCH).total_seconds() + 5  # in virtual seconds
        await asyncio.sleep(lifetime_end - 0.5 - asyncio.get_running_loop().time())
        [filler] = server.reservations("other")
        server.delete(
            resource_path("headroom.dev", "v1alpha1", "reservations", "other") + "/filler"
        )
        controller.reservations.on_event("DELETED", filler)  # room, half a second before
        await asyncio.sleep(0.1)
        [admitted] = server.reservations(NS)
        assert admitted["status"]["phase"] == "Admitted"
        expiry = datetime.fromisoformat(admitted["status"]["expiresAt"])
        assert (expiry - DEFAULT_EPOCH).total_seconds() == lifetime_end
        for _ in range(6):  # it runs out; then, the pod's backoff after a refusal: 10 s
            await deliver_reservations(server, controller)
        assert not [at for at in sent if at < lifetime_end + 9]  # not for the first one
        assert len(let_out) == 1
        uid, phase = let_out[0]
        assert phase == "Admitted"
        assert uid != first["metadata"]["uid"]
        await controller.stop()

    run_virtual(scenario(), max_virtual_seconds=600)


class PatchesOf:
    """The operator's transport, noting when each patch of one path was sent."""

    def __init__(self, inner: Transport, path: str, sent: list[float]) -> None:
        self._inner, self._path, self._sent = inner, path, sent

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def json_patch(self, path: str, operations: list[JSON]) -> JSON:
        if path == self._path:
            self._sent.append(asyncio.get_running_loop().time())
        return await self._inner.json_patch(path, operations)
