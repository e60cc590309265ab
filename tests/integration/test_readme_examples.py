"""The docs' examples run as written (node and label names swapped for the test's own),
against the real control plane and a running operator: the library example of
docs/tasks/claim-from-a-program.md, the GPU example of docs/tasks/gpus.md and the quota
of docs/tasks/quotas.md (they were the README's until the docs moved to docs/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.controlplane import ControlPlane
from headroom_dev.operator import OperatorProcess
from tests.polling import eventually

DOCS = Path(__file__).resolve().parents[2] / "docs"
CLAIM_DOC = DOCS / "tasks" / "claim-from-a-program.md"
GPU_DOC = DOCS / "tasks" / "gpus.md"
QUOTA_DOC = DOCS / "tasks" / "quotas.md"


def library_example() -> str:
    text = CLAIM_DOC.read_text()
    section = text[text.index("# Claim memory from a program") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, f"{CLAIM_DOC} lost its library example"
    return match.group(1)


def runnable(example: str, node: str, label: str) -> str:
    """The example as a script: train() and serve() say they ran; the top-level
    ``async with`` goes into a coroutine that asyncio runs."""
    example = example.replace("gpu-node-1", node).replace("gpu=a100", label)
    sync, _, rest = example.partition("async with")
    assert rest, "the example lost its asyncio part"
    prelude = textwrap.dedent(
        """
        import asyncio

        def train() -> None:
            print("TRAINED")

        async def serve() -> None:
            print("SERVED")
        """
    )
    coroutine = "async def main() -> None:\n" + textwrap.indent("async with" + rest, "    ")
    return prelude + sync + coroutine + "\n\nasyncio.run(main())\n"


def test_the_library_example_runs_as_written(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    control_plane: ControlPlane,
    custom: client.CustomObjectsApi,
    namespace: str,
    tmp_path: Path,
) -> None:
    node, value = f"readme-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:8]
    make_node(node, memory="32Gi", labels={"gpu": value, "nvidia.com/gpu.memory": "24576"})
    run_operator()

    def summarized() -> None:  # --node auto reads NodeHeadrooms
        names = [
            h["metadata"]["name"]
            for h in custom.list_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms")[
                "items"
            ]
        ]
        assert node in names

    eventually(summarized)
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    script = tmp_path / "example.py"
    script.write_text(runnable(library_example(), node, f"gpu={value}"))

    result = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"holding {namespace}/" in result.stdout
    assert f" on {node}" in result.stdout
    assert result.stdout.count("TRAINED") == 1, result.stdout
    assert result.stdout.count("SERVED") == 1, result.stdout
    assert rsv.list_all(custom, namespace) == []  # both claims released on leaving the block


def gpu_example() -> list[dict[str, Any]]:
    text = GPU_DOC.read_text()
    section = text[text.index("# Claim GPU memory") :]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match, f"{GPU_DOC} lost its GPU example"
    return [doc for doc in yaml.safe_load_all(match.group(1)) if doc]


def test_the_gpu_example_admits_two_and_refuses_the_third_as_written(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    custom: client.CustomObjectsApi,
    namespace: str,
) -> None:
    """The Node and the three claims of "GPU memory per device", node and namespace
    swapped for the test's own; the statuses and the refusal read as the doc says."""
    node, *claims = gpu_example()
    name = f"readme-gpu-{uuid.uuid4().hex[:6]}"
    make_node(name, memory="32Gi", labels=node["metadata"]["labels"])
    run_operator()
    for claim in claims:
        spec = claim["spec"] | {"node": name}
        extra = {k: v for k, v in spec.items() if k not in ("node", "ramMB", "vramMB")}
        rsv.create(
            custom,
            namespace,
            claim["metadata"]["name"],
            name,
            spec["ramMB"],
            spec["vramMB"],
            **extra,
        )
    decided = {
        c["metadata"]["name"]: rsv.wait_for(custom, namespace, c["metadata"]["name"])
        for c in claims
    }
    a, b, c = (decided[n]["status"] for n in ("shard-a", "shard-b", "shard-c"))
    assert (a["phase"], b["phase"]) == ("Admitted", "Admitted")
    assert a["devices"] == [{"id": "gfd-0", "memoryMB": 51200}]  # as the doc shows
    assert b["devices"] == [{"id": "gfd-1", "memoryMB": 51200}]
    assert (c["phase"], c["reason"]) == ("Rejected", "InsufficientVRAM")
    said = (
        f"node {name}: needs 1 device with 51200 MiB free; largest free 30720 MiB "
        "(gfd-0 80 GiB, 51200 held)"
    )
    assert c["message"] == said
    assert said.replace(name, "gpu-node-1") in " ".join(GPU_DOC.read_text().split())

    def shows_the_largest_free_device() -> None:
        listed = custom.list_cluster_custom_object("headroom.dev", "v1alpha1", "nodeheadrooms")
        found = [h.get("status") or {} for h in listed["items"] if h["metadata"]["name"] == name]
        assert found, f"no NodeHeadroom for {name} yet"
        status = found[0]
        assert status.get("largestFreeDeviceMB") == 30720, status
        assert status.get("gpuSource") == "GFD", status

    eventually(shows_the_largest_free_device)


def quota_example() -> dict[str, Any]:
    text = QUOTA_DOC.read_text()
    section = text[text.index("# Give each tenant a quota") :]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match, f"{QUOTA_DOC} lost its quota example"
    [quota] = [doc for doc in yaml.safe_load_all(match.group(1)) if doc]
    return dict(quota)


def test_the_quota_example_applies_and_its_message_reads_as_the_doc_says(
    run_operator: Callable[..., OperatorProcess],
    make_node: Callable[..., Any],
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
) -> None:
    """The HeadroomQuota of "Quotas per tenant" as written (its name and team label
    swapped for the test's own, since quotas are cluster-wide): 56 GiB held, 16 more
    refused in the doc's words."""
    quota = quota_example()
    tag = uuid.uuid4().hex[:6]
    quota["metadata"]["name"] = name = f"team-ml-{tag}"
    quota["spec"]["namespaceSelector"] = {"matchLabels": {"team": f"ml-{tag}"}}
    namespace = f"ml-train-{tag}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"team": f"ml-{tag}"}}})
    node = f"readme-q-{tag}"
    make_node(node, memory="128Gi", labels={"pool": "gpu"})
    custom.create_cluster_custom_object("headroom.dev", "v1alpha1", "headroomquotas", quota)
    try:
        run_operator()
        rsv.create(custom, namespace, "held", node, 56 * 1024)
        assert rsv.wait_for(custom, namespace, "held")["status"]["phase"] == "Admitted"
        rsv.create(custom, namespace, "more", node, 16 * 1024)
        status = rsv.wait_for(custom, namespace, "more")["status"]
        said = f"namespace {namespace} (quota {name}): holds 56 GiB of 64 GiB RAM; requested 16 GiB"
        assert (status["reason"], status["message"]) == ("QuotaExceeded", said)
        doc = " ".join(QUOTA_DOC.read_text().split())
        assert said.replace(name, "team-ml").replace(namespace, "ml-train") in doc
        held = rsv.get(custom, namespace, "held")
        created = datetime.fromisoformat(held["metadata"]["creationTimestamp"])
        expires = datetime.fromisoformat(held["status"]["expiresAt"])
        assert expires - created == timedelta(hours=8)  # defaultLifetime
    finally:
        custom.delete_cluster_custom_object("headroom.dev", "v1alpha1", "headroomquotas", name)
        custom.delete_collection_namespaced_custom_object(
            "headroom.dev", "v1alpha1", namespace, "reservations"
        )
        core.delete_namespace(namespace)
