"""An operator stand-in that admits every claim on GPU devices with UUIDs.

The real operator assigns devices only on a node whose GPU inventory it reads,
and its inventories from GFD labels get synthetic ids (``gfd-0``), never the
UUIDs ``CUDA_VISIBLE_DEVICES`` takes. To see what a claim does with UUIDs, this
thread plays the operator's part on the API server: each undecided reservation
in the namespace is written ``Admitted`` with ``status.devices`` as the operator
writes them (``ceil(vramMB / gpus)`` on each of the first ``gpus`` devices),
through the status subresource and the CRD's schema. No operator runs meanwhile.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from headroom.api.parse import format_time
from headroom_dev import reservations as rsv

UUIDS = (
    "GPU-aabbccdd-1111-2222-3333-444455556666",
    "GPU-eeff0011-1111-2222-3333-444455556666",
)


def admission(spec: dict[str, Any], ids: tuple[str, ...]) -> dict[str, Any]:
    """The status the operator writes when it admits ``spec`` on ``ids`` (the first few)."""
    vram, gpus = spec.get("vramMB", 0), spec.get("gpus", 1)
    devices = []
    if vram and gpus:
        share = -(-vram // gpus)
        devices = [{"id": device, "memoryMB": share} for device in ids[:gpus]]
    on = ", ".join(f"{d['id'][:12]}… ({d['memoryMB']} MiB)" for d in devices)
    return {
        "phase": "Admitted",
        "reason": "Fits",
        "message": (
            f"node {spec['node']}: reserved {spec['ramMB']} MiB RAM and {vram} MiB VRAM"
            + (f" on {on}" if on else "")
        ),
        "admittedAt": format_time(datetime.now(UTC)),
        **({"devices": devices} if devices else {}),
    }


class DeviceAdmitter(threading.Thread):
    """Admits each new reservation of ``namespace`` on ``ids`` until stopped."""

    def __init__(
        self, custom: client.CustomObjectsApi, namespace: str, ids: tuple[str, ...] = UUIDS
    ) -> None:
        super().__init__(name="device-admitter", daemon=True)
        self.custom, self.namespace, self.ids = custom, namespace, ids
        self.admitted: list[str] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(0.05):
            for obj in rsv.list_all(self.custom, self.namespace):
                if (obj.get("status") or {}).get("phase"):
                    continue
                name = obj["metadata"]["name"]
                try:
                    rsv.write_status(
                        self.custom, self.namespace, name, admission(obj["spec"], self.ids)
                    )
                except client.ApiException as error:
                    if error.status != 404:  # deleted meanwhile: fine
                        raise
                self.admitted.append(name)

    def stop(self) -> None:
        self._stopping.set()
        self.join(5)
