"""Raw HTTPS as one client-certificate identity, with the API server's APF headers.

kube-apiserver's API Priority and Fairness filter names, on every answer it
classified, the FlowSchema and the PriorityLevelConfiguration the request went to
(``X-Kubernetes-PF-FlowSchema-UID``, ``X-Kubernetes-PF-PriorityLevel-UID``). The
official client hides response headers, so the fairness tests speak HTTP themselves.
"""

from __future__ import annotations

import http.client
import json
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headroom_dev.controlplane import ControlPlane

FLOW_SCHEMA_HEADER = "X-Kubernetes-PF-FlowSchema-UID"
PRIORITY_LEVEL_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"

#: The served version of each API group the operator's roles name. A role that gains a
#: group fails the coverage test with a KeyError until it is added here.
GROUP_VERSIONS = {
    "": "v1",
    "headroom.dev": "v1alpha1",
    "resource.k8s.io": "v1",
    "coordination.k8s.io": "v1",
    "apiextensions.k8s.io": "v1",
    "admissionregistration.k8s.io": "v1",
    "authentication.k8s.io": "v1",
    "authorization.k8s.io": "v1",
}
CLUSTER_SCOPED = {
    "nodes",
    "namespaces",
    "nodeheadrooms",
    "headroomquotas",
    "resourceslices",
    "customresourcedefinitions",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "tokenreviews",
    "subjectaccessreviews",
}


@dataclass(frozen=True)
class Answer:
    status: int
    flow_schema: str | None
    priority_level: str | None
    body: bytes


class Identity:
    """One user (and groups) on one keep-alive connection; one per thread."""

    def __init__(
        self, plane: ControlPlane, directory: Path, user: str, groups: tuple[str, ...] = ()
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        stem = re.sub(r"[^a-z0-9-]", "-", user.lower())
        cert, key = plane.client_identity(user, groups).write(directory, stem)
        self.user = user
        self.port = plane.apiserver_port
        self.context = ssl.create_default_context(cafile=str(plane.pki / "ca.crt"))
        self.context.load_cert_chain(str(cert), str(key))
        self._conn: http.client.HTTPSConnection | None = None

    def clone(self) -> Identity:
        """The same identity on a connection of its own (for another thread)."""
        other = object.__new__(Identity)
        other.user, other.port, other.context = self.user, self.port, self.context
        other._conn = None
        return other

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        *,
        headers_only: bool = False,
    ) -> Answer:
        """Send one request; ``headers_only`` closes the connection after the headers
        (a WATCH answers its headers at once and its body never ends)."""
        if self._conn is None:
            self._conn = http.client.HTTPSConnection(
                "127.0.0.1", self.port, context=self.context, timeout=60
            )
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            self._conn.request(method, path, body=data, headers=headers)
            response = self._conn.getresponse()
            payload = b"" if headers_only else response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        answer = Answer(
            response.status,
            response.getheader(FLOW_SCHEMA_HEADER),
            response.getheader(PRIORITY_LEVEL_HEADER),
            payload,
        )
        if headers_only:
            self.close()
        return answer

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def collection_path(group: str, resource: str, namespace: str) -> str:
    """The collection a rule's resource lives in (``namespace`` if it is namespaced)."""
    version = GROUP_VERSIONS[group]
    prefix = f"/api/{version}" if group == "" else f"/apis/{group}/{version}"
    if resource in CLUSTER_SCOPED:
        return f"{prefix}/{resource}"
    return f"{prefix}/namespaces/{namespace}/{resource}"


def probe(
    identity: Identity, group: str, resource: str, verb: str, name: str, namespace: str
) -> Answer:
    """One request of ``verb`` on ``resource`` (``kind/subresource`` too). Writes are
    dry runs and bodies are empty: what they answer does not matter, only where the
    API server classified them (it does so before authorization and decoding)."""
    kind, _, sub = resource.partition("/")
    collection = collection_path(group, kind, namespace)
    item = f"{collection}/{name}" + (f"/{sub}" if sub else "")
    merge = "application/merge-patch+json"
    match verb:
        case "get":
            return identity.request("GET", item)
        case "list":
            return identity.request("GET", f"{collection}?limit=1")
        case "watch":
            return identity.request(
                "GET", f"{collection}?watch=1&timeoutSeconds=1", headers_only=True
            )
        case "create":
            return identity.request("POST", f"{collection}?dryRun=All", {})
        case "update":
            return identity.request("PUT", f"{item}?dryRun=All", {})
        case "patch":
            return identity.request("PATCH", f"{item}?dryRun=All", {}, merge)
        case "delete":
            return identity.request("DELETE", f"{item}?dryRun=All")
    raise AssertionError(f"no probe for verb {verb!r} (of {resource})")


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:]+)(\{(?P<labels>.*)\})? (?P<value>\S+)$")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if not sample or sample["name"] != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', sample["labels"] or ""))
        if all(have.get(key) == value for key, value in labels.items()):
            total += float(sample["value"])
    return total


@dataclass(frozen=True)
class Sample:
    start: float
    seconds: float
    answer: Answer | None
    error: str = ""


def keep_sending(
    identity: Identity, request: Callable[[Identity, int], Answer], stop: threading.Event
) -> list[Sample]:
    """Call ``request`` back to back until ``stop``; every call is recorded, an exception too."""
    samples: list[Sample] = []
    count = 0
    while not stop.is_set():
        count += 1
        start = time.monotonic()
        try:
            answer: Answer | None = request(identity, count)
            error = ""
        except Exception as failure:  # recorded, and fails the test below
            answer, error = None, repr(failure)
        samples.append(Sample(start, time.monotonic() - start, answer, error))
    identity.close()
    return samples


Job = tuple[Identity, Callable[[Identity, int], Answer]]


def run_all(
    jobs: list[Job], stop: threading.Event
) -> tuple[list[threading.Thread], list[list[Sample]]]:
    """One thread per job, sending until ``stop``; the samples once they are joined."""
    results: list[list[Sample]] = [[] for _ in jobs]

    def run(index: int) -> None:
        identity, request = jobs[index]
        results[index] = keep_sending(identity, request, stop)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    return threads, results


def rate(samples: list[Sample], start: float, end: float) -> float:
    served = [s for s in samples if start <= s.start and s.start + s.seconds <= end]
    return len(served) / (end - start)
