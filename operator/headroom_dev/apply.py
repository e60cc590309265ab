"""Install CRDs into a control plane and wait until they are served."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import yaml
from kubernetes import client, config


def api_client(kubeconfig: Path) -> client.ApiClient:
    """A synchronous client for the identity in ``kubeconfig``."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


def install_crds(api: client.ApiClient, paths: Iterable[Path], timeout: float = 30.0) -> list[str]:
    """Create or replace each CRD file's object; return the CRD names once Established."""
    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in paths:
        body = yaml.safe_load(path.read_text())
        name = body["metadata"]["name"]
        try:
            current = ext.read_custom_resource_definition(name).metadata
            assert current is not None
            body["metadata"]["resourceVersion"] = current.resource_version
            ext.replace_custom_resource_definition(name, body)
        except client.ApiException as error:
            if error.status != 404:
                raise
            ext.create_custom_resource_definition(body)
        names.append(name)
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(ext, name):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout}s")
            time.sleep(0.1)
    return names


def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    conditions = (crd.status and crd.status.conditions) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)
