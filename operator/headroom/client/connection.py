"""Where a claim is made: the API server and the namespace, found as kubectl finds them.

A program claims memory from a laptop (a kubeconfig) or from inside a pod (its
service account), and should not have to say which: as kubectl, an explicit
kubeconfig or ``$KUBECONFIG`` or ``~/.kube/config`` wins, with its current context
and that context's namespace; without one, inside a pod, the service account's
token and CA and its namespace file are used. ``$KUBECONFIG`` is read at each call
(the official client reads it once, at import).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader

#: Where Kubernetes mounts a pod's service account.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The downward-API variable that names the pod a program runs in.
POD_NAME_VARIABLE = "POD_NAME"


@dataclass
class Connection:
    """An API client plus the namespace claims are made in."""

    api: client.ApiClient
    namespace: str

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


def from_kubeconfig(
    kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
) -> Connection:
    """As kubectl: ``kubeconfig`` (or ``$KUBECONFIG``, or ``~/.kube/config``), the named or
    current context, and ``namespace`` or the context's, else ``default``."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    contexts, current = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    chosen = next((c for c in contexts if c["name"] == context), current) if context else current
    api = config.new_client_from_config(config_file=path, context=context)  # type: ignore[no-untyped-call]
    default = (chosen or {}).get("context", {}).get("namespace") or "default"
    return Connection(cast(client.ApiClient, api), namespace or default)


def in_cluster(
    namespace: str | None = None,
    *,
    service_account: Path = SERVICE_ACCOUNT_DIR,
    environ: dict[str, str] | None = None,
) -> Connection:
    """From inside a pod: the service account's token and CA, and its namespace file
    (unless ``namespace`` is given)."""
    configuration = client.Configuration()
    loader: Any = InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=str(service_account / "token"),
        cert_filename=str(service_account / "ca.crt"),
        environ=os.environ if environ is None else environ,
    )
    loader.load_and_set(configuration)
    if namespace is None:
        try:
            namespace = (service_account / "namespace").read_text().strip() or "default"
        except OSError:
            namespace = "default"
    return Connection(client.ApiClient(configuration), namespace)


def connect(
    kubeconfig: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    *,
    service_account: Path = SERVICE_ACCOUNT_DIR,
) -> Connection:
    """A kubeconfig when one is named or present, else the pod's service account.

    Raises ``kubernetes.config.ConfigException`` when neither is usable.
    """
    if kubeconfig or context or os.environ.get("KUBECONFIG"):
        return from_kubeconfig(kubeconfig, context, namespace)
    if Path("~/.kube/config").expanduser().exists():
        return from_kubeconfig(None, None, namespace)
    try:
        return in_cluster(namespace, service_account=service_account)
    except ConfigException as error:
        raise ConfigException(
            "no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a pod "
            f"({error}): cannot reach the cluster"
        ) from None


def this_pod() -> str | None:
    """The pod this program runs in, from ``$POD_NAME`` (set it with the downward API)."""
    return os.environ.get(POD_NAME_VARIABLE) or None
