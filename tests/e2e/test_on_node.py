"""The operator the way users run it: the chart's image on a real node (issue 12, item 5).

Everything else runs the operator as a local process. Here it is a pod from the
image ``hack/image/build.sh`` builds without a Docker engine, installed with
``helm install``, scheduled by kube-scheduler onto a node whose kubelet runs it,
with its ServiceAccount token and in-cluster config; workloads are pods in the
same image that claim memory with ``headroom hold``/``reserve`` from inside their
containers. The tests share one release and run in file order: install, work,
upgrade and fail over, load, uninstall.

Needs root (containerd, runc, the CNI bridge): ``make test`` builds and installs
what it needs (``make node image``); nothing here skips.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from headroom.api.constants import GROUP, VERSION
from headroom_dev.apply import api_client
from headroom_dev.cluster import (
    CHART,
    RELEASE,
    RELEASE_NAMESPACE,
    WORKER,
    NodeCluster,
    claiming_pod_spec,
    worker_access,
)
from headroom_dev.process import kubectl_for
from headroom_dev.prometheus import PrometheusServer, service_monitor_scrape
from tests.polling import eventually

TEAM = "team"
STALE = 9  # seconds: `hold` heartbeats every third of it
RSV = "reservations.headroom.dev"
VALUES: dict[str, Any] = {
    "config": {
        "limits": {"heartbeatStaleWindow": f"{STALE}s"},
        "sweepPeriod": "1s",
        "reclaimedRetention": "10m",
    },
    "nodeHeadroomReaders": {"serviceAccounts": [{"namespace": TEAM, "name": WORKER}]},
    # The worker may scrape /metrics too (the chart's default: HTTPS and a token).
    "metrics": {"readers": {"serviceAccounts": [{"namespace": TEAM, "name": WORKER}]}},
}
MiB = 1 << 20
ALERT_RULES = CHART / "rules" / "headroom-alerts.yaml"


@pytest.fixture(scope="module")
def cluster() -> Iterator[NodeCluster]:
    with NodeCluster() as cluster:
        took = cluster.install(VALUES)
        print(f"figures: {cluster.figures}; helm install -> operator Ready {took:.1f}s")
        cluster.apply(worker_access(TEAM))
        yield cluster


class Heartbeats:
    """The owners of ``names`` are alive: a heartbeat each a third of the stale window."""

    def __init__(self, cluster: NodeCluster) -> None:
        self.names: set[str] = set()
        self._api = api_client(cluster.plane.kubeconfig)
        self._custom = client.CustomObjectsApi(self._api)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(STALE / 3):
            beat = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            body = {"metadata": {"annotations": {"headroom.dev/heartbeat": beat}}}
            for name in sorted(self.names):
                with contextlib.suppress(client.ApiException):
                    self._custom.patch_namespaced_custom_object(
                        GROUP, VERSION, TEAM, "reservations", name, body
                    )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._api.close()


@pytest.fixture(scope="module")
def heartbeats(cluster: NodeCluster) -> Iterator[Heartbeats]:
    beats = Heartbeats(cluster)
    yield beats
    beats.stop()


def operator_pods(cluster: NodeCluster) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = cluster.get(
        "pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/name=headroom"
    )["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def status(cluster: NodeCluster, name: str, namespace: str = TEAM) -> dict[str, Any]:
    """The reservation's status; ``{}`` while it does not exist (yet)."""
    items = cluster.get(RSV, "-n", namespace, f"--field-selector=metadata.name={name}")["items"]
    got: dict[str, Any] = (items[0].get("status") or {}) if items else {}
    return got


def reservation(name: str, node: str, ram_mb: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "Reservation",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {"node": node, "ramMB": ram_mb, **spec},
    }


def reaches(cluster: NodeCluster, name: str, phase: str, reason: str) -> None:
    got = status(cluster, name)
    assert (got.get("phase"), got.get("reason")) == (phase, reason), got


def admitted(cluster: NodeCluster, name: str, namespace: str = TEAM) -> dict[str, Any]:
    got = status(cluster, name, namespace)
    assert got.get("phase") == "Admitted", got
    return got


def pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        # An owner pod carries this label, or its claim is Rejected OwnerPodNotLabelled.
        "metadata": {"name": name, "namespace": TEAM, "labels": {"headroom.dev/owner": "true"}},
        "spec": spec,
    }


def test_the_chart_runs_the_operator_in_cluster(cluster: NodeCluster) -> None:
    operators = operator_pods(cluster)
    assert len(operators) == 2, [p["metadata"]["name"] for p in operators]  # HA by default
    for operator in operators:
        spec = operator["spec"]
        (container,) = spec["containers"]
        assert container["image"] == cluster.image
        assert spec["serviceAccountName"] == RELEASE
        assert spec["nodeName"] == cluster.node.name  # placed by kube-scheduler
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["securityContext"]["runAsUser"] == 65532
        # In-cluster config: no kubeconfig anywhere, the projected token is mounted.
        assert not any(e["name"] == "KUBECONFIG" for e in container.get("env", []))
        assert any(v.get("projected") for v in spec["volumes"])
        assert _ready(operator), operator["status"]
    eventually(lambda: _leader(cluster), timeout=30)  # exactly one holds the Lease
    whoami = cluster.kubectl(
        "auth", "whoami", f"--as=system:serviceaccount:{RELEASE_NAMESPACE}:{RELEASE}", "-o", "json"
    )
    assert json.loads(whoami)["status"]["userInfo"]["username"].endswith(f":{RELEASE}")

    node = cluster.get("node", cluster.node.name)
    allocatable_mib = _mib(node["status"]["allocatable"]["memory"])

    def summarised() -> dict[str, Any]:
        # Absent until the leader (elected after both replicas are ready) writes it.
        found = cluster.get("nodeheadrooms", f"--field-selector=metadata.name={cluster.node.name}")
        summary: dict[str, Any] = (found["items"] or [{}])[0].get("status") or {}
        assert summary.get("totalRAMMB") == allocatable_mib, summary
        return summary

    eventually(summarised, timeout=30)
    cluster.apply([reservation("first", cluster.node.name, 256)])
    eventually(lambda: admitted(cluster, "first"), timeout=30)
    too_big = allocatable_mib + 1
    cluster.apply([reservation("too-big", cluster.node.name, too_big)])
    eventually(lambda: reaches(cluster, "too-big", "Rejected", "InsufficientRAM"), timeout=30)


def test_a_quota_refuses_in_cluster_and_its_status_shows_the_usage(
    cluster: NodeCluster,
) -> None:
    """The operator in its pod, with the chart's RBAC, follows HeadroomQuotas and the
    Namespaces they select, and writes their status (issue 21)."""
    tenant = "quota-tenant"
    quota = {
        "apiVersion": "headroom.dev/v1alpha1",
        "kind": "HeadroomQuota",
        "metadata": {"name": "e2e-tenant"},
        "spec": {"namespaceSelector": {"matchLabels": {"e2e-quota": "yes"}}, "ramMB": 512},
    }
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": tenant, "labels": {"e2e-quota": "yes"}},
    }
    cluster.apply([namespace, quota])
    try:
        first, second = (reservation(n, cluster.node.name, 384) for n in ("q-first", "q-over"))
        first["metadata"]["namespace"] = second["metadata"]["namespace"] = tenant
        cluster.apply([first])
        eventually(lambda: admitted(cluster, "q-first", tenant), timeout=30)
        cluster.apply([second])

        def refused() -> None:
            got = status(cluster, "q-over", tenant)
            assert (got.get("phase"), got.get("reason")) == ("Rejected", "QuotaExceeded"), got
            said = f"namespace {tenant} (quota e2e-tenant): holds 384 MiB of 512 MiB RAM"
            assert got["message"].startswith(said), got

        eventually(refused, timeout=30)

        def shown() -> None:
            got = cluster.get("headroomquotas", "e2e-tenant").get("status") or {}
            assert (got.get("ramMB"), got.get("remainingRAMMB")) == (384, 128), got
            columns = cluster.kubectl("get", "hq", "e2e-tenant").split("\n")[0].split()
            assert columns[:4] == ["NAME", "RAM-USED", "RAM-LIMIT", "VRAM-USED"], columns

        eventually(shown, timeout=30)
    finally:
        cluster.kubectl("delete", "headroomquota", "e2e-tenant", "--ignore-not-found")
        cluster.kubectl("delete", RSV, "--all", "-n", tenant, "--ignore-not-found")


def test_a_job_claims_heartbeats_from_its_container_and_releases(cluster: NodeCluster) -> None:
    script = 'echo "holding $HEADROOM_RESERVATION"; sleep 10'
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": TEAM},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"headroom.dev/owner": "true"}},
                "spec": claiming_pod_spec(cluster.image, cluster.node.name, script, 1024),
            },
        },
    }
    cluster.apply([job])
    beats: set[str] = set()
    phases: set[str] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        claims = [
            c
            for c in cluster.get(RSV, "-n", TEAM)["items"]
            if (c["spec"].get("owner") or {}).get("pod", "").startswith("train-")
        ]
        for claim in claims:
            phases.add((claim.get("status") or {}).get("phase", ""))
            beat = (claim["metadata"].get("annotations") or {}).get("headroom.dev/heartbeat")
            if beat:
                beats.add(beat)
        done = cluster.get("job", "train", "-n", TEAM).get("status") or {}
        if done.get("succeeded") == 1 and not claims and phases:
            break
        assert not done.get("failed"), cluster.kubectl("logs", "-n", TEAM, "job/train")
        time.sleep(0.5)
    else:
        pytest.fail(f"job not done with its claim released: phases={phases} beats={beats}")
    assert "Admitted" in phases, phases
    assert "Reclaimed" not in phases, phases
    # 10 s of work with a heartbeat every 3 s: the annotation changed from inside the pod.
    assert len(beats) >= 3, beats
    assert "holding team/" in cluster.kubectl("logs", "-n", TEAM, "job/train")


def test_a_deleted_owner_pod_releases_its_claim(cluster: NodeCluster) -> None:
    node = cluster.node.name
    # `reserve` then heartbeat by hand: when the pod goes, nothing in it releases the
    # claim (the shell, pid 1, ignores SIGTERM); the operator must, as the pod is gone.
    script = (
        f"headroom reserve --node {node} --ram 128 --owner-pod $POD_NAME --name owned --wait"
        " && while headroom heartbeat owned >/dev/null; do sleep 2; done"
    )
    spec = claiming_pod_spec(cluster.image, node, script, 0)
    spec["containers"][0]["command"] = ["sh", "-c", script]
    spec["terminationGracePeriodSeconds"] = 2
    cluster.apply([pod("owner", spec)])
    eventually(lambda: admitted(cluster, "owned"), timeout=60)
    time.sleep(STALE + 2)  # longer than the stale window: the heartbeats keep it
    admitted(cluster, "owned")
    cluster.kubectl("delete", "pod", "owner", "-n", TEAM, "--wait=true", "--timeout=60s")
    eventually(lambda: reaches(cluster, "owned", "Reclaimed", "OwnerPodDeleted"), timeout=30)


def test_a_silent_owner_is_reclaimed_while_its_pod_runs(cluster: NodeCluster) -> None:
    node = cluster.node.name
    script = (
        f"headroom reserve --node {node} --ram 128 --owner-pod $POD_NAME --name silent --wait"
        " && sleep 3600"
    )
    spec = claiming_pod_spec(cluster.image, node, script, 0)
    spec["containers"][0]["command"] = ["sh", "-c", script]
    spec["terminationGracePeriodSeconds"] = 0
    cluster.apply([pod("silent", spec)])
    eventually(lambda: admitted(cluster, "silent"), timeout=60)
    eventually(
        lambda: reaches(cluster, "silent", "Reclaimed", "HeartbeatStale"), timeout=STALE + 20
    )
    assert cluster.get("pod", "silent", "-n", TEAM)["status"]["phase"] == "Running"
    cluster.kubectl("delete", "pod", "silent", "-n", TEAM, "--wait=false")


def test_the_garbage_collector_deletes_a_node_headroom_with_its_node(cluster: NodeCluster) -> None:
    memory = {"memory": "8Gi"}
    extra = {"capacity": memory, "allocatable": memory}
    cluster.apply([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "extra"}}])
    cluster.kubectl("patch", "node", "extra", "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": extra}))  # fmt: skip

    def written() -> list[dict[str, Any]]:
        found = cluster.get("nodeheadrooms", "--field-selector=metadata.name=extra")["items"]
        assert found, "no NodeHeadroom for extra yet"
        owners: list[dict[str, Any]] = found[0]["metadata"]["ownerReferences"]
        return owners

    owners = eventually(written, timeout=30)
    assert [o["kind"] for o in owners] == ["Node"]
    cluster.kubectl("delete", "node", "extra")

    def collected() -> None:
        names = [i["metadata"]["name"] for i in cluster.get("nodeheadrooms")["items"]]
        assert "extra" not in names, names

    eventually(collected, timeout=60)


def test_a_drain_keeps_one_ready_replica_and_a_decider(
    cluster: NodeCluster, heartbeats: Heartbeats
) -> None:
    """The PodDisruptionBudget (minAvailable 1) holds against `kubectl drain`: the node
    is the only one, so an evicted replica's successor cannot be placed, and the drain
    must give up rather than evict the last replica. That one decides."""
    node = cluster.node.name
    eventually(lambda: _disruptions_allowed(cluster, 1), timeout=30)
    leader = _leader(cluster)
    try:
        drained = kubectl_for(cluster.plane.kubeconfig)(
            "drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
            "--pod-selector=app.kubernetes.io/name=headroom", "--timeout=25s",
        )  # fmt: skip
        assert drained.returncode != 0, drained.stdout  # the budget refused an eviction
        assert "disruption budget" in drained.stderr + drained.stdout, drained.stderr
        running = [p for p in operator_pods(cluster) if p["status"].get("phase") == "Running"]
        assert len(running) == 1, [p["metadata"]["name"] for p in running]
        # The evicted one may have been the leader: then the standby took over.
        survivor = eventually(lambda: _leader(cluster), timeout=60)
        assert survivor == running[0]["metadata"]["name"], (survivor, leader)
        heartbeats.names.add("during-drain")
        cluster.apply([reservation("during-drain", node, 64)])
        eventually(lambda: admitted(cluster, "during-drain"), timeout=60)
    finally:
        cluster.kubectl("uncordon", node)

    def both_ready() -> None:
        pods = operator_pods(cluster)
        assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
        assert all(_ready(p) for p in pods), [p["status"] for p in pods]

    eventually(both_ready, timeout=120)


def test_helm_upgrade_keeps_every_decision_and_the_standby_takes_over(
    cluster: NodeCluster, heartbeats: Heartbeats
) -> None:
    kept = [f"kept-{i}" for i in range(5)]
    heartbeats.names.update(kept)
    cluster.apply([reservation(name, cluster.node.name, 64) for name in kept])
    for name in kept:
        eventually(lambda name=name: admitted(cluster, name), timeout=30)
    before = _decisions(cluster)
    assert before["too-big"] == ("Rejected", "InsufficientRAM")
    assert before["silent"] == ("Reclaimed", "HeartbeatStale")
    old = {p["metadata"]["name"] for p in operator_pods(cluster)}
    # Claims keep arriving during the rolling update; the Lease is sampled throughout.
    rolling = RollingWatch(cluster, heartbeats)
    try:
        took = cluster.install(
            {"config": {**VALUES["config"], "summaryInterval": "2s"}}, upgrade=True
        )
        # helm returns once the new pods are ready; the last old one (the leader, if
        # the standby went first) is still stopping, and hands over the Lease as it goes.
        eventually(lambda: _gone(cluster, old), timeout=60)
        leader = eventually(lambda: _leader(cluster), timeout=30)
        assert leader not in old, leader
        time.sleep(1)  # one more sample with the new leader
    finally:
        rolling.stop()
    print(f"helm upgrade -> 2 new replicas Ready {took:.1f}s; {rolling.report()}")
    pods = operator_pods(cluster)
    assert len(pods) == 2
    assert not old & {p["metadata"]["name"] for p in pods}, old
    config = cluster.get("configmap", f"{RELEASE}-config", "-n", RELEASE_NAMESPACE)
    assert "summaryInterval: 2s" in json.dumps(config["data"])
    assert {k: v for k, v in _decisions(cluster).items() if k in before} == before
    # Every claim made during the rollout is decided, once, by a leader of the moment.
    for name in rolling.created:
        eventually(lambda name=name: admitted(cluster, name), timeout=60)
    assert rolling.holders_without_pod == [], rolling.holders_without_pod
    assert len(rolling.holders) >= 2, rolling.report()  # the Lease moved to a new pod
    # The Lease was never left to expire (15 s): each leader released it as it stopped,
    # and a standby took it after the release's margin (leaseDuration - renewDeadline, 5 s).
    assert rolling.longest_gap < 10, rolling.report()
    # Out of the way of the load test's 80 (maxEntriesPerNode is 110).
    heartbeats.names.difference_update(rolling.created)
    cluster.kubectl("delete", RSV, "-n", TEAM, *rolling.created, "--wait=false")
    gone = set(rolling.created)
    before = {k: v for k, v in _decisions(cluster).items() if k not in gone}

    leader = eventually(lambda: _leader(cluster), timeout=30)
    after_upgrade = [f"after-upgrade-{i}" for i in range(5)]
    heartbeats.names.update(after_upgrade)
    cluster.apply([reservation(name, cluster.node.name, 64) for name in after_upgrade])
    decided = [
        eventually(lambda i=i: admitted(cluster, f"after-upgrade-{i}"), 30) for i in range(5)
    ]
    # Exactly one decides: every new decision carries one process's run id.
    assert len({d["decisionID"].rsplit("-", 1)[0] for d in decided}) == 1, decided

    cluster.kubectl("delete", "pod", leader, "-n", RELEASE_NAMESPACE, "--wait=false")
    began = time.monotonic()

    def taken_over() -> str:
        holder = _leader(cluster)
        assert holder != leader, holder
        return holder

    new_leader = eventually(taken_over, timeout=60)
    heartbeats.names.add("after-failover")
    cluster.apply([reservation("after-failover", cluster.node.name, 64)])
    after = eventually(lambda: admitted(cluster, "after-failover"), timeout=60)
    print(f"failover: {new_leader} decides {time.monotonic() - began:.1f}s after the delete")
    assert after["decisionID"].rsplit("-", 1)[0] != decided[0]["decisionID"].rsplit("-", 1)[0]
    now = _decisions(cluster)
    assert {k: v for k, v in now.items() if k in before} == before


def test_probes_limits_and_read_only_root_hold_under_load(
    cluster: NodeCluster, heartbeats: Heartbeats
) -> None:
    node = cluster.node.name
    names = [f"load-{i}" for i in range(80)]
    heartbeats.names.update(names[:40])  # the owners of half of them stay alive
    cluster.apply([reservation(n, node, 16) for n in names])
    deadline = time.monotonic() + 3 * STALE
    while time.monotonic() < deadline:
        for p in operator_pods(cluster):
            (state,) = p["status"]["containerStatuses"]
            assert state["restartCount"] == 0, state
        time.sleep(2)
    phases = {n: _phase_reason(cluster, n) for n in names}
    assert all(phases[n] == ("Admitted", "Fits") for n in names[:40]), phases
    assert all(phases[n] == ("Reclaimed", "HeartbeatStale") for n in names[40:]), phases
    stats = cluster.node.stats_summary()
    for p in operator_pods(cluster):
        (container,) = p["spec"]["containers"]
        limit = _mib(container["resources"]["limits"]["memory"]) * MiB
        (pod_stats,) = [s for s in stats["pods"] if s["podRef"]["name"] == p["metadata"]["name"]]
        used = pod_stats["containers"][0]["memory"]["workingSetBytes"]
        name = p["metadata"]["name"]
        print(f"operator {name}: working set {used / MiB:.0f} MiB of {limit / MiB:.0f}")
        assert 0 < used < limit
        ready = [c for c in p["status"]["conditions"] if c["type"] == "Ready"]
        assert [c["status"] for c in ready] == ["True"]
    # The root filesystem really is read-only inside the running container.
    leader = _leader(cluster)
    write = "try: open('/probe', 'w')\nexcept OSError as error: print(error)"
    probe = cluster.kubectl("exec", "-n", RELEASE_NAMESPACE, leader, "--", "python", "-c", write)
    assert "Read-only file system" in probe, probe


def test_a_second_release_in_another_namespace_does_not_collide(
    cluster: NodeCluster, heartbeats: Heartbeats
) -> None:
    """Its cluster-scoped objects carry its own name; with replicas: 0 (the documented way
    to keep one beside the running release) it neither decides nor gates, and removing it
    leaves the first release's roles, webhook and decisions alone."""
    second, namespace = "headroom-b", "headroom-b"
    path = cluster.plane.workdir / "second-values.yaml"
    path.write_text(json.dumps({"replicas": 0, "crds": {"install": False}}))
    cluster.helm(
        "install", second, str(CHART), "-n", namespace, "--create-namespace", "-f", str(path),
        "--wait", "--timeout", "120s",
    )  # fmt: skip
    try:
        ours = _cluster_scoped(cluster, RELEASE)
        theirs = _cluster_scoped(cluster, second)
        assert ours
        assert theirs
        assert not ours & theirs, ours & theirs
        assert all(name.split("/", 1)[1].startswith(second) for name in theirs), theirs
        heartbeats.names.add("beside-second")
        cluster.apply([reservation("beside-second", cluster.node.name, 64)])
        eventually(lambda: admitted(cluster, "beside-second"), timeout=30)
        assert cluster.get("pods", "-n", namespace)["items"] == []
        # Not the second's webhook (there is none): the first's still gates and answers.
        hooks = cluster.get("mutatingwebhookconfigurations")["items"]
        assert [h["metadata"]["name"] for h in hooks] == [RELEASE], hooks
    finally:
        cluster.helm("uninstall", second, "-n", namespace, "--wait")
    assert _cluster_scoped(cluster, RELEASE) == ours
    heartbeats.names.add("after-second")
    cluster.apply([reservation("after-second", cluster.node.name, 64)])
    eventually(lambda: admitted(cluster, "after-second"), timeout=30)


#: Run inside the operator's container (its image has Python): GET /metrics over TLS
#: (the self-signed certificate, so unverified) with argv[1] as the token, if any.
SCRAPE = """
import ssl, sys, urllib.request, urllib.error
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
request = urllib.request.Request("https://127.0.0.1:8443/metrics")
if len(sys.argv) > 1:
    request.add_header("Authorization", "Bearer " + sys.argv[1])
try:
    with urllib.request.urlopen(request, context=context, timeout=10) as answer:
        print(answer.status, "# TYPE headroom_" in answer.read().decode())
except urllib.error.HTTPError as error:
    print(error.code, False)
"""


def test_metrics_need_a_token_whose_account_may_read_them(cluster: NodeCluster) -> None:
    """The chart's defaults on a real pod: no token 401; the operator's own token 403
    (its account is not a reader); the worker's (metrics.readers) 200 with metrics.
    The kubelet's probes, on their own plain-HTTP port, keep the pods Ready meanwhile."""
    pod = operator_pods(cluster)[0]["metadata"]["name"]

    def scrape(*token: str) -> str:
        argv = ["exec", "-n", RELEASE_NAMESPACE, pod, "--", "python", "-c", SCRAPE, *token]
        return cluster.kubectl(*argv).strip()

    assert scrape() == "401 False"
    read_own = "print(open('/var/run/secrets/kubernetes.io/serviceaccount/token').read())"
    operator_token = cluster.kubectl(
        "exec", "-n", RELEASE_NAMESPACE, pod, "--", "python", "-c", read_own
    ).strip()
    assert scrape(operator_token) == "403 False"
    worker_token = cluster.kubectl("create", "token", WORKER, "-n", TEAM).strip()
    assert scrape(worker_token) == "200 True"
    for p in operator_pods(cluster):
        ready = [c for c in p["status"]["conditions"] if c["type"] == "Ready"]
        assert [c["status"] for c in ready] == ["True"]


def test_prometheus_scrapes_both_replicas_as_the_service_monitor_says(
    cluster: NodeCluster, tmp_path: Path
) -> None:
    """A live Prometheus (Debian's) on the host scrapes the operator pods on the node the
    way the chart's ServiceMonitor tells the Prometheus Operator to: https, the self-signed
    certificate unverified, the bearer token of an account in metrics.readers. Both
    replicas are up, exactly one says it leads, and the shipped alerts about the operator
    itself stay quiet."""
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps({**VALUES, "serviceMonitor": {"enabled": True}}))
    rendered = cluster.helm(
        "template", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "-f", str(values),
        "-s", "templates/servicemonitor.yaml",
    )  # fmt: skip
    (endpoint,) = yaml.safe_load(rendered)["spec"]["endpoints"]
    assert endpoint["scheme"] == "https", endpoint
    targets = []
    for p in operator_pods(cluster):
        (container,) = p["spec"]["containers"]
        (port,) = [q for q in container["ports"] if q["name"] == endpoint["port"]]
        targets.append(f"{p['status']['podIP']}:{port['containerPort']}")
    token = tmp_path / "token"
    token.write_text(cluster.kubectl("create", "token", WORKER, "-n", TEAM).strip())
    job = service_monitor_scrape("headroom", endpoint, targets, token)
    with PrometheusServer([job], rule_files=[ALERT_RULES]) as prom:
        prom.wait_for('count(up{job="headroom"} == 1) == 2', timeout=60)
        (leaders,) = prom.wait_for('sum(headroom_leader{job="headroom"})')
        assert float(leaders["value"][1]) == 1, leaders
        versions = prom.query('count(headroom_build_info{job="headroom"})')
        assert float(versions[0]["value"][1]) == 2, versions
        time.sleep(3)  # a few rule evaluations (every second)
        loud = prom.query('ALERTS{alertname=~"HeadroomOperatorDown|HeadroomNoLeader"}')
        assert loud == [], loud


def test_helm_uninstall_keeps_the_crds_and_every_reservation(cluster: NodeCluster) -> None:
    before = _decisions(cluster)
    cluster.helm("uninstall", RELEASE, "-n", RELEASE_NAMESPACE, "--wait")
    eventually(lambda: _no_operator(cluster), timeout=60)
    crds = [c["metadata"]["name"] for c in cluster.get("crds")["items"]]
    assert {"reservations.headroom.dev", "nodeheadrooms.headroom.dev"} <= set(crds)
    assert _decisions(cluster) == before


# -- helpers --------------------------------------------------------------------------


class RollingWatch:
    """During a rollout: a new claim every half second, and the Lease's holder sampled
    as often, with how long no pod held it."""

    def __init__(self, cluster: NodeCluster, heartbeats: Heartbeats) -> None:
        self.created: list[str] = []
        self.holders_without_pod: list[str] = []
        self.holders: set[str] = set()
        self.longest_gap = 0.0
        self._cluster, self._heartbeats = cluster, heartbeats
        self._api = api_client(cluster.plane.kubeconfig)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        coordination, core = client.CoordinationV1Api(self._api), client.CoreV1Api(self._api)
        custom = client.CustomObjectsApi(self._api)
        held_since = time.monotonic()
        while not self._stop.wait(0.5):
            name = f"rolling-{len(self.created)}"
            self._heartbeats.names.add(name)
            body = reservation(name, self._cluster.node.name, 16)
            with contextlib.suppress(client.ApiException):
                custom.create_namespaced_custom_object(GROUP, VERSION, TEAM, "reservations", body)
                self.created.append(name)
            lease = coordination.read_namespaced_lease(RELEASE, RELEASE_NAMESPACE).spec
            pods = core.list_namespaced_pod(
                RELEASE_NAMESPACE, label_selector="app.kubernetes.io/name=headroom"
            ).items
            holder = lease.holder_identity or ""
            renewed = lease.renew_time
            fresh = renewed is not None and (
                (datetime.now(UTC) - renewed).total_seconds() < (lease.lease_duration_seconds or 15)
            )
            if holder and fresh:
                self.holders.add(holder)
                if not any(holder.startswith(p.metadata.name + "-") for p in pods):
                    self.holders_without_pod.append(holder)
                held_since = time.monotonic()
            self.longest_gap = max(self.longest_gap, time.monotonic() - held_since)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._api.close()

    def report(self) -> str:
        return (
            f"{len(self.created)} claims made during the rollout, {len(self.holders)} "
            f"leaders, longest time without a live Lease {self.longest_gap:.1f}s"
        )


def _gone(cluster: NodeCluster, names: set[str]) -> None:
    left = names & {p["metadata"]["name"] for p in _all_operator_pods(cluster)}
    assert not left, left


def _all_operator_pods(cluster: NodeCluster) -> list[dict[str, Any]]:
    """Terminating ones too."""
    pods: list[dict[str, Any]] = cluster.get(
        "pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/name=headroom"
    )["items"]
    return pods


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _disruptions_allowed(cluster: NodeCluster, expected: int) -> None:
    budget = cluster.get("pdb", RELEASE, "-n", RELEASE_NAMESPACE).get("status") or {}
    assert budget.get("disruptionsAllowed") == expected, budget


def _cluster_scoped(cluster: NodeCluster, release: str) -> set[str]:
    """kind/name of the release's cluster-scoped objects (by its instance label)."""
    kinds = (
        "clusterroles,clusterrolebindings,mutatingwebhookconfigurations,"
        "validatingwebhookconfigurations,"
        "flowschemas,prioritylevelconfigurations"
    )
    found = cluster.get(kinds, "-l", f"app.kubernetes.io/instance={release}")["items"]
    return {f"{o['kind']}/{o['metadata']['name']}" for o in found}


def _no_operator(cluster: NodeCluster) -> None:
    assert operator_pods(cluster) == []


def _mib(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor // MiB
    return int(quantity) // MiB


def _phase_reason(cluster: NodeCluster, name: str) -> tuple[str, str]:
    got = status(cluster, name)
    return got.get("phase", ""), got.get("reason", "")


def _decisions(cluster: NodeCluster) -> dict[str, tuple[str, str]]:
    items = cluster.get(RSV, "-n", TEAM)["items"]
    return {
        i["metadata"]["name"]: (
            (i.get("status") or {}).get("phase", ""),
            (i.get("status") or {}).get("reason", ""),
        )
        for i in items
    }


def _leader(cluster: NodeCluster) -> str:
    """The operator pod that holds the Lease (its identity starts with the pod's name)."""
    leases = cluster.get("leases", "-n", RELEASE_NAMESPACE)["items"]
    holders = [
        lease["spec"].get("holderIdentity") or ""
        for lease in leases
        if lease["metadata"]["name"] == RELEASE
    ]
    names = [
        p["metadata"]["name"]
        for p in operator_pods(cluster)
        if any(h.startswith(p["metadata"]["name"] + "-") for h in holders)
    ]
    assert len(names) == 1, (holders, names)
    return names[0]
