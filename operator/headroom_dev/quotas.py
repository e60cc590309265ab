"""Create HeadroomQuotas and label namespaces: helpers for tests, demo and bench."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

GROUP, VERSION, PLURAL = "headroom.dev", "v1alpha1", "headroomquotas"


def quota(name: str, namespace_labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HeadroomQuota",
        "metadata": {"name": name},
        "spec": {"namespaceSelector": {"matchLabels": namespace_labels}, **spec},
    }


def create(
    custom: client.CustomObjectsApi, name: str, namespace_labels: dict[str, str], **spec: Any
) -> dict[str, Any]:
    body = quota(name, namespace_labels, **spec)
    return cast(dict[str, Any], custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body))


def get(custom: client.CustomObjectsApi, name: str) -> dict[str, Any]:
    return cast(dict[str, Any], custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name))


def patch_spec(custom: client.CustomObjectsApi, name: str, **spec: Any) -> None:
    custom.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": spec})


def delete(custom: client.CustomObjectsApi, name: str) -> None:
    try:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
    except client.ApiException as error:
        if error.status != 404:
            raise


def label_namespace(core: client.CoreV1Api, namespace: str, labels: dict[str, str]) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": labels}})
