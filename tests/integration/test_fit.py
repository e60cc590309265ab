"""``kubectl headroom fit``: the nodes where a claim fits now, best first, from the
NodeHeadrooms the operator writes; ``-l`` by the Node labels they carry, and what a caller who
may not read NodeHeadrooms is told.

Nodes are cluster-scoped and NodeHeadrooms of earlier tests' nodes may remain (this
control plane has no garbage collector), so each test labels its nodes and selects
them, or looks only at its own rows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from headroom_dev.nodes import node_body
from headroom_dev.operator import OperatorProcess
from tests.integration.cli_checks import Cli, assert_one_line_error
from tests.polling import eventually

GPU = {"nvidia.com/gpu.memory": "8192", "tier": "gpu"}


def headroom_status(custom: client.CustomObjectsApi, node: str) -> dict[str, Any]:
    listed = custom.list_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms")
    found = [h.get("status") or {} for h in listed["items"] if h["metadata"]["name"] == node]
    assert found, f"no NodeHeadroom for {node} yet"
    return found[0]


@pytest.fixture
def cluster_of_nodes(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    namespace: str,
) -> Iterator[str]:
    """Seven nodes labelled ``fit-test=<prefix>``; returns the prefix.

    big 32768 MiB to give; gpu-a and gpu-b 16384 with 8192 of VRAM, 7168 and 2048 of
    it free; plain 16384, VRAM unknown; full (nothing left); capped (its one entry
    taken); unknown (no capacity reported).
    """
    prefix = f"fit-{uuid.uuid4().hex[:5]}"
    mine = {"fit-test": prefix}
    make_node(f"{prefix}-big", memory="33Gi", labels=mine)
    make_node(f"{prefix}-gpu-a", memory="17Gi", labels={**mine, **GPU})
    make_node(f"{prefix}-gpu-b", memory="17Gi", labels={**mine, **GPU})
    make_node(f"{prefix}-plain", memory="17Gi", labels=mine)
    make_node(f"{prefix}-full", memory="9Gi", labels=mine)
    make_node(
        f"{prefix}-capped",
        memory="17Gi",
        labels=mine,
        annotations={"headroom.dev/max-entries": "1"},
    )
    core.create_node(node_body(f"{prefix}-unknown", labels=mine))  # no status: no capacity
    try:
        run_operator()
        for name, node, ram, vram in [
            ("a", "gpu-a", 0, 1024),
            ("b", "gpu-b", 0, 6144),
            ("full", "full", 8192, 0),
            ("capped", "capped", 1024, 0),
        ]:
            rsv.create(custom, namespace, name, f"{prefix}-{node}", ram, vram)
            assert rsv.wait_for(custom, namespace, name)["status"]["phase"] == "Admitted"

        def published() -> None:
            assert headroom_status(custom, f"{prefix}-gpu-b").get("reservedVRAMMB") == 6144
            assert headroom_status(custom, f"{prefix}-full").get("allocatableRAMMB") == 0
            assert headroom_status(custom, f"{prefix}-capped").get("activeEntries") == 1
            assert headroom_status(custom, f"{prefix}-unknown").get("capacityKnown") is False

        eventually(published)
        yield prefix
    finally:
        core.delete_node(f"{prefix}-unknown")


def test_fit_lists_the_nodes_that_fit_now_best_first(cli: Cli, cluster_of_nodes: str) -> None:
    p = cluster_of_nodes
    result = cli("fit", "--ram", "4096", "--vram", "2048", "-l", f"fit-test={p}")
    assert result.returncode == 0, result.stderr
    assert [line.split() for line in result.stdout.splitlines()] == [
        ["NODE", "ALLOCATABLE", "FREE-VRAM", "FREE-DEVICE", "ENTRIES", "QUEUED"],
        [f"{p}-big", "32768", "-", "-", "0/110", "0"],  # the most RAM first
        [f"{p}-gpu-a", "16384", "7168", "7168", "1/110", "0"],  # then the most free VRAM
        [f"{p}-gpu-b", "16384", "2048", "2048", "1/110", "0"],  # (one GPU each: gfd-0)
        [f"{p}-plain", "16384", "-", "-", "0/110", "0"],  # VRAM unknown: after the known
    ]
    data = json.loads(
        cli("fit", "--ram", "4096", "--vram", "4096", "-l", f"fit-test={p}", "-o", "json").stdout
    )
    assert [d["node"] for d in data] == [f"{p}-big", f"{p}-gpu-a", f"{p}-plain"]
    assert data[1] == {
        "node": f"{p}-gpu-a",
        "fits": True,
        "whyNot": None,
        "allocatableRAMMB": 16384,
        "freeVRAMMB": 7168,
        "activeEntries": 1,
        "maxEntries": 110,
        "queuedEntries": 0,
        "largestFreeDeviceMB": 7168,  # its one GPU (GFD labels), 1024 of 8192 held
    }
    gpus = cli("fit", "--ram", "1024", "-l", f"fit-test={p},tier=gpu")
    assert [line.split()[0] for line in gpus.stdout.splitlines()[1:]] == [
        f"{p}-gpu-a",
        f"{p}-gpu-b",
    ]
    everywhere = cli("fit", "--ram", "20000")  # no selector: every node, ours among them
    assert everywhere.returncode == 0, everywhere.stderr
    ours = [line.split()[0] for line in everywhere.stdout.splitlines() if line.startswith(p)]
    assert ours == [f"{p}-big"]


def test_when_no_node_fits_fit_says_why_node_by_node_and_exits_1(
    cli: Cli, cluster_of_nodes: str
) -> None:
    p = cluster_of_nodes
    result = cli("fit", "--ram", "40000", "-l", f"fit-test={p}")
    assert result.returncode == 1, result.stdout
    assert_one_line_error(
        result,
        f"no node matching 'fit-test={p}' has room for 40000 MiB RAM now (",
        f"{p}-big: allocatable 32768 MiB < 40000 MiB",
        f"{p}-capped: entry cap reached (1/1)",
        f"{p}-full: allocatable 0 MiB < 40000 MiB",
        f"{p}-unknown: capacity unknown",
    )
    vram = cli("fit", "--ram", "1024", "--vram", "8000", "-l", f"fit-test={p},tier=gpu")
    assert vram.returncode == 1
    assert_one_line_error(vram, f"{p}-gpu-a: free VRAM 7168 MiB < 8000 MiB")
    bad = cli("fit", "--ram", "0")
    assert bad.returncode == 2
    assert_one_line_error(bad, "at least one of --ram and --vram must be above 0")


@pytest.fixture
def reader_without_nodes(
    kubectl: Callable[..., Any], control_plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[Path, Path]]:
    """Two identities: one may read NodeHeadrooms but not Nodes, one may read neither."""
    name = f"fit-reader-{uuid.uuid4().hex[:5]}"
    created = [
        kubectl(
            "create",
            "clusterrole",
            name,
            "--verb=get,list,watch",
            "--resource=nodeheadrooms.headroom.dev",
        ),
        kubectl("create", "clusterrolebinding", name, f"--clusterrole={name}", f"--user={name}"),
    ]
    assert all(c.returncode == 0 for c in created), [c.stderr for c in created]
    reader = control_plane.write_kubeconfig(tmp_path / "reader.kubeconfig", name)
    nobody = control_plane.write_kubeconfig(tmp_path / "nobody.kubeconfig", f"{name}-nobody")
    yield reader, nobody
    kubectl("delete", "clusterrolebinding", name)
    kubectl("delete", "clusterrole", name)


def test_a_selector_needs_no_right_on_nodes(
    cli: Cli, cluster_of_nodes: str, reader_without_nodes: tuple[Path, Path]
) -> None:
    """Node labels are on NodeHeadrooms: a reader of NodeHeadrooms selects by them."""
    reader, nobody = reader_without_nodes
    everywhere = cli("fit", "--ram", "1024", kubeconfig=reader)
    assert everywhere.returncode == 0, everywhere.stderr
    assert f"{cluster_of_nodes}-big" in everywhere.stdout
    selected = cli("fit", "--ram", "1024", "-l", f"fit-test={cluster_of_nodes}", kubeconfig=reader)
    assert selected.returncode == 0, selected.stderr
    assert f"{cluster_of_nodes}-big" in selected.stdout
    assert all(
        line.split()[0].startswith(cluster_of_nodes) for line in selected.stdout.splitlines()[1:]
    ), selected.stdout
    blind = cli("fit", "--ram", "1024", kubeconfig=nobody)
    assert blind.returncode == 4
    assert_one_line_error(blind, "cannot list NodeHeadrooms", "headroom-nodeheadroom-reader")


def gpu_status(held: list[int], memory: int = 81920) -> dict[str, Any]:
    """A NodeHeadroom status as the operator writes it for a node of 2 × 80 GiB GPUs
    (GFD), 32768 MiB of RAM to give, with ``held`` MiB admitted on each device."""
    return {
        "capacityKnown": True,
        "totalRAMMB": 33792,
        "systemReserveMB": 1024,
        "maxOvercommitRatio": "1",
        "limitRAMMB": 32768,
        "reservedRAMMB": 0,
        "allocatableRAMMB": 32768,
        "reservedVRAMMB": sum(held),
        "vramCapacityMB": memory * len(held),
        "activeEntries": sum(1 for mib in held if mib),
        "staleEntries": 0,
        "maxEntries": 110,
        "utilizationPercent": 0,
        "overCommitted": False,
        "gpuSource": "GFD",
        "gpuPolicy": "binpack",
        "largestFreeDeviceMB": max(memory - mib for mib in held),
        "devices": [
            {"id": f"gfd-{i}", "kind": "gpu", "memoryMB": memory}
            | {"reservedMB": mib, "freeMB": memory - mib}
            for i, mib in enumerate(held)
        ],
    }


@pytest.fixture
def gpu_headrooms(custom: client.CustomObjectsApi, crds: list[str]) -> Iterator[str]:
    """NodeHeadrooms labelled ``fit-test=<prefix>`` (no operator runs: they stay as
    written): gpu-full holds two 50 GiB claims on its two 80 GiB GPUs, gpu-half one."""
    prefix = f"fitgpu-{uuid.uuid4().hex[:5]}"
    nodes = {"gpu-full": [51200, 51200], "gpu-half": [51200, 0]}
    for short, held in nodes.items():
        name = f"{prefix}-{short}"
        metadata = {"name": name, "labels": {"fit-test": prefix}}
        body = {"apiVersion": "headroom.dev/v1alpha1", "kind": "NodeHeadroom", "metadata": metadata}
        custom.create_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms", body)
        custom.patch_cluster_custom_object_status(
            "headroom.dev", "v1alpha1", "nodeheadrooms", name, {"status": gpu_status(held)}
        )
    yield prefix
    for short in nodes:
        custom.delete_cluster_custom_object(
            "headroom.dev", "v1alpha1", "nodeheadrooms", f"{prefix}-{short}"
        )


def test_fit_reasons_per_gpu_device(cli: Cli, gpu_headrooms: str) -> None:
    """The third 50 GiB claim on 2 × 80 GiB GPUs fits nowhere although 60 GiB are free."""
    p, selector = gpu_headrooms, f"fit-test={gpu_headrooms}"
    third = cli("fit", "--ram", "0", "--vram", "51200", "-l", selector)
    assert third.returncode == 0, third.stderr
    assert [line.split() for line in third.stdout.splitlines()] == [
        ["NODE", "ALLOCATABLE", "FREE-VRAM", "FREE-DEVICE", "ENTRIES", "QUEUED"],
        [f"{p}-gpu-half", "32768", "112640", "81920", "1/110", "0"],
    ]
    refused = cli("fit", "--ram", "0", "--vram", "81921", "--gpus", "1", "-l", selector)
    assert refused.returncode == 1
    assert_one_line_error(
        refused,
        f"{p}-gpu-full: free VRAM 61440 MiB < 81921 MiB",  # the node-wide sum first
        f"{p}-gpu-half: needs 1 device with 81921 MiB free; 0 of 2 have it "
        "(free MiB: gfd-1 81920, gfd-0 30720)",
    )
    spread = cli(
        "fit", "--ram", "0", "--vram", "51200", "--gpus", "2", "-l", selector, "-o", "json"
    )
    assert [(d["node"], d["largestFreeDeviceMB"]) for d in json.loads(spread.stdout)] == [
        (f"{p}-gpu-half", 81920),
        (f"{p}-gpu-full", 30720),
    ]
    devices = cli("nodes", "--devices")
    mine = [line.split() for line in devices.stdout.splitlines() if line.startswith(p)]
    assert mine == [
        [f"{p}-gpu-full", "gfd-0", "gpu", "-", "81920", "51200", "0", "30720"],
        [f"{p}-gpu-full", "gfd-1", "gpu", "-", "81920", "51200", "0", "30720"],
        [f"{p}-gpu-half", "gfd-0", "gpu", "-", "81920", "51200", "0", "30720"],
        [f"{p}-gpu-half", "gfd-1", "gpu", "-", "81920", "0", "0", "81920"],
    ]
