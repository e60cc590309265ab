"""An in-memory Kubernetes API server implementing :class:`headroom.kube.transport.Transport`.

Faithful where the control code can tell (resourceVersions, 404/409/410/422,
status subresource, watches with label-selector transitions and bookmarks,
paged lists), fast (no I/O, copies only at the boundary) and deterministic on
:mod:`headroom_dev.sim.loop`. ``tests/integration/test_fake_api_contract.py``
runs the same behaviours against kube-apiserver and this, and must agree.

    server = FakeApiServer(seed=7)
    operator = server.client("operator-0", FaultPlan(seed=7, throttle=0.05))
    server.put_node("gpu-1", memory=32768)
    server.create_reservation("ml", "train-1", "gpu-1", 4096)
"""

from headroom_dev.sim.fakeapi.client import FakeClient
from headroom_dev.sim.fakeapi.events import EventLog, EventRecord
from headroom_dev.sim.fakeapi.faults import ALL_VERBS, READ_VERBS, WRITE_VERBS, Fate, FaultPlan
from headroom_dev.sim.fakeapi.server import FakeApiServer
from headroom_dev.sim.fakeapi.watch import WatchStream

__all__ = [
    "ALL_VERBS",
    "READ_VERBS",
    "WRITE_VERBS",
    "EventLog",
    "EventRecord",
    "FakeApiServer",
    "FakeClient",
    "Fate",
    "FaultPlan",
    "WatchStream",
]
