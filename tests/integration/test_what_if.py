"""``what_if`` and ``kubectl headroom fit --dry-run`` (issue 32) on the real API server.

The operator runs as a process with its webhook on loopback, registered by URL (the
Reservations' ValidatingWebhookConfiguration of the chart's shape, beside the pods'
mutating one of the same name; the operator patches the caBundle into both). A
server-side dry run then returns the operator's outlook as ``Warning`` headers; the
library and the command line read it back. Nothing is created: the namespace holds
only what the test created itself. Without the webhook there is no outlook, and
both say so instead of guessing.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from headroom.api.constants import GROUP, OUTLOOK_MODE, STRICT, VERSION
from headroom.api.outlook import Verdict
from headroom.client import ClaimRefusedError, Connection, WhatIf, claim, what_if, what_if_async
from headroom.client.whatif import NO_OUTLOOK_RETURNED
from headroom_dev import reservations as rsv
from headroom_dev.operator import OperatorProcess
from tests.integration.cli_checks import Cli
from tests.integration.test_webhook import Gate
from tests.polling import eventually


def names(custom: client.CustomObjectsApi, namespace: str) -> list[str]:
    return sorted(r["metadata"]["name"] for r in rsv.list_all(custom, namespace))


def summarized(custom: client.CustomObjectsApi, node: str) -> None:
    listed = custom.list_cluster_custom_object(GROUP, VERSION, "nodeheadrooms")["items"]
    known = [(h.get("status") or {}).get("capacityKnown") for h in listed]
    mine = [k for h, k in zip(listed, known, strict=True) if h["metadata"]["name"] == node]
    assert mine == [True], mine


def test_what_if_says_admitted_queued_rejected_and_creates_nothing(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    connection: Connection,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")  # 10240 MiB allocatable
    run_operator(outlook.config())

    def answered() -> None:  # the caBundle trusted, the leader rebuilt
        said = what_if(node, ram_mb=6000, connection=connection)
        assert said.verdict is Verdict.ADMITTED, said

    eventually(answered, timeout=30)
    admitted = what_if(node, ram_mb=6000, connection=connection)
    assert (admitted.node, admitted.outlook.node) == (node, node)
    assert "MiB RAM free" in admitted.outlook.detail

    rsv.create(custom, namespace, "first", node, 6000)
    assert rsv.wait_for(custom, namespace, "first")["status"]["phase"] == "Admitted"

    queued = what_if(node, ram_mb=6000, wait="5m", connection=connection)
    assert (queued.verdict, queued.outlook.node, queued.outlook.position) == (
        Verdict.QUEUED,
        node,
        1,
    ), queued
    assert queued.outlook.reason == "InsufficientRAM"

    rejected = what_if(node, ram_mb=6000, connection=connection)
    assert (rejected.verdict, rejected.outlook.reason) == (Verdict.REJECTED, "InsufficientRAM")
    assert node in rejected.outlook.detail
    also: WhatIf = asyncio.run(what_if_async(node, ram_mb=6000, connection=connection))
    assert also.outlook == rejected.outlook

    nowhere = what_if("no-such-node", ram_mb=1, name="named", connection=connection)
    assert (nowhere.verdict, nowhere.outlook.reason) == (Verdict.REJECTED, "NodeUnknown")

    assert names(custom, namespace) == ["first"]  # the dry runs stored nothing
    # The real claim then gets what was foreseen.
    rsv.create(custom, namespace, "second", node, 6000, wait="5m")
    status = rsv.wait_for(custom, namespace, "second", phases=("Queued",))["status"]
    assert (status["queuePosition"], status["reason"]) == (1, "InsufficientRAM"), status


def test_fit_dry_run_prints_the_outlook_and_exits_by_it(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    connection: Connection,
    cli: Cli,
    namespace: str,
) -> None:
    node = f"n-{uuid.uuid4().hex[:6]}"
    label = {"what-if-test": node}
    make_node(node, memory="11Gi", labels=label)
    run_operator(outlook.config())
    eventually(lambda: summarized(custom, node), timeout=30)
    eventually(
        lambda: _assert(what_if(node, ram_mb=1, connection=connection).verdict is Verdict.ADMITTED),
        timeout=30,
    )

    chosen = cli("fit", "--ram", "6000", "--dry-run", "-l", f"what-if-test={node}")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.startswith(f"would be admitted on {node}: "), chosen.stdout

    rsv.create(custom, namespace, "first", node, 6000)
    assert rsv.wait_for(custom, namespace, "first")["status"]["phase"] == "Admitted"

    queued = cli(
        "fit", "--ram", "6000", "--dry-run", "--node", node, "--wait-for-room", "5m", "-o", "json"
    )
    assert queued.returncode == 5, queued.stderr
    said = json.loads(queued.stdout)
    assert (said["verdict"], said["node"], said["position"], said["reason"]) == (
        "Queued",
        node,
        1,
        "InsufficientRAM",
    ), said

    rejected = cli("fit", "--ram", "6000", "--dry-run", "--node", node)
    assert rejected.returncode == 1, rejected.stderr
    assert rejected.stdout.startswith("would be rejected InsufficientRAM: "), rejected.stdout

    assert names(custom, namespace) == ["first"]


def test_without_the_webhook_there_is_no_outlook_and_it_is_said(
    crds: list[str],
    custom: client.CustomObjectsApi,
    connection: Connection,
    cli: Cli,
    namespace: str,
) -> None:
    said = what_if("any-node", ram_mb=1, connection=connection)
    assert said.verdict is Verdict.UNKNOWN
    assert said.outlook.detail == NO_OUTLOOK_RETURNED

    unknown = cli("fit", "--ram", "1", "--dry-run", "--node", "any-node", "-o", "json")
    assert unknown.returncode == 6, unknown.stderr
    assert json.loads(unknown.stdout)["verdict"] == "Unknown"
    assert names(custom, namespace) == []


def _assert(condition: bool) -> None:
    assert condition


def test_under_strict_mode_the_library_and_the_cli_are_refused_at_create(
    outlook: Gate,
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    connection: Connection,
    cli: Cli,
    namespace: str,
) -> None:
    """A strict namespace: what the ledger would reject is refused at create, and the
    library raises what a Rejected status would have made it raise; the CLI exits 1."""
    node = f"n-{uuid.uuid4().hex[:6]}"
    make_node(node, memory="11Gi")
    run_operator(outlook.config())
    eventually(lambda: _admitted_outlook(node, connection), timeout=30)
    core.patch_namespace(namespace, {"metadata": {"labels": {OUTLOOK_MODE: STRICT}}})

    def refused() -> None:
        with (
            pytest.raises(ClaimRefusedError) as error,
            claim(node, ram_mb=20_000, connection=connection, timeout=10),
        ):
            pass
        assert (error.value.phase, error.value.reason) == ("Rejected", "InsufficientRAM")
        assert "20000" in error.value.message

    eventually(refused, timeout=15)  # once the namespace's label is seen
    # A dry run is refused too, and what_if still reads the outlook from the refusal.
    said = what_if(node, ram_mb=20_000, connection=connection)
    assert (said.verdict, said.outlook.reason) == (Verdict.REJECTED, "InsufficientRAM"), said
    result = cli("reserve", "--node", node, "--ram", "20000")
    assert result.returncode == 1, result.stderr
    assert "refused at create" in result.stderr
    assert "InsufficientRAM" in result.stderr
    assert names(custom, namespace) == []


def _admitted_outlook(node: str, connection: Connection) -> None:
    said = what_if(node, ram_mb=1, connection=connection)
    assert said.verdict is Verdict.ADMITTED, said
