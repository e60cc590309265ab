"""Fake Nodes for a control plane without kubelets.

Nothing runs on these nodes; only their ``status.capacity`` / ``status.allocatable``
and labels matter to Headroom, so we create the object and write its status
subresource directly, as a kubelet would.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client


def node_body(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations)
    )


def node_status(memory: str, allocatable: str | None = None) -> dict[str, Any]:
    return {
        "status": {
            "capacity": {"memory": memory, "cpu": "8", "pods": "110"},
            "allocatable": {"memory": allocatable or memory, "cpu": "8", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "headroom dev node",
                }
            ],
        }
    }


def create_node(
    core: client.CoreV1Api,
    name: str,
    *,
    memory: str,
    allocatable: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Any:
    """Create a Node and give it a memory capacity (e.g. ``"32Gi"``)."""
    core.create_node(node_body(name, labels=labels, annotations=annotations))
    return core.patch_node_status(name, node_status(memory, allocatable))


def set_node_memory(
    core: client.CoreV1Api, name: str, memory: str, allocatable: str | None = None
) -> Any:
    """Resize a Node, as a kubelet reporting new capacity would."""
    return core.patch_node_status(name, node_status(memory, allocatable))
