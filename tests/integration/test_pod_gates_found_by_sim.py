"""Gated pods on the real control plane: what the simulation found (issue 29, Tests).

Each test here is a schedule of ``headroom_dev.sim`` that broke a promise, reduced
to the step that broke it and played on the real API server:

- a gated pod's condition whose write failed (a 500, a refused connection) was
  never written again while nothing about the pod changed: a pod that can go
  nowhere, or whose reservation was refused, said nothing, or the wrong thing,
  for ever (seeds 4, 32 and 136 of the simulation);
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from kubernetes import client

from headroom.api.config import parse_config
from headroom.control.controller import Controller
from headroom_dev.faults import FaultyTransport, Rule
from tests.integration.polling import eventually
from tests.integration.test_pod_gates import claim_pod, pool_nodes
from tests.integration.test_pod_gates_edits import inprocess, ours

__all__ = ["inprocess"]  # the fixture, used here


async def test_a_gated_pods_condition_lost_to_a_failed_write_is_written_again(
    inprocess: tuple[FaultyTransport, list[Controller]],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    namespace: str,
) -> None:
    transport, started = inprocess
    await asyncio.to_thread(pool_nodes, make_node, core, only="8Gi")
    config = parse_config("{sweepPeriod: 100ms, summaryInterval: 100ms, resyncPeriod: 2s}")
    controller = Controller(config, transport)
    started.append(controller)
    status = f"/namespaces/{namespace}/pods/p/status"
    failing = transport.add(Rule("PATCH", status, "refuse-500"))  # a busy API server
    await controller.start()
    # A pod no node may take: once the operator labelled it, nothing about it changes.
    await asyncio.to_thread(
        core.create_namespaced_pod, namespace, claim_pod("p", "no-such-pool", "1Gi")
    )

    def refused_once_labelled() -> None:
        pod = core.read_namespaced_pod("p", namespace)
        assert (pod.metadata.labels or {}).get("headroom.dev/owner") == "true"
        assert transport.calls_to("PATCH", status) >= 1

    await asyncio.to_thread(eventually, refused_once_labelled)
    await asyncio.sleep(1.0)  # the passes its labelling caused are over: all refused
    failing.times = 0  # the API server answers again
    assert ours(core, namespace, "p") == []

    def said_why() -> None:
        assert ours(core, namespace, "p") == [("False", "NoNode")]

    # Within a few of its passes (resync 2 s, the per-pod backoff): not only if it changes.
    await asyncio.to_thread(eventually, said_why, timeout=20)
