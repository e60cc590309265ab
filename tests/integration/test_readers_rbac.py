"""Who may read headroom: the chart's ``nodeHeadroomReaders`` value that grants the
cluster-scoped NodeHeadrooms."""

from __future__ import annotations

import json

from tests.integration.test_chart import render

READER = "headroom-nodeheadroom-reader"
READER_RULES = [
    {
        "apiGroups": ["headroom.dev"],
        "resources": ["nodeheadrooms"],
        "verbs": ["get", "list", "watch"],
    }
]


def readers_value(**subjects: object) -> str:
    return f"nodeHeadroomReaders={json.dumps(subjects)}"


def test_the_readers_value_renders_one_binding_with_its_subjects() -> None:
    docs = render(
        readers_value(
            groups=["ml-team"],
            users=["alice"],
            serviceAccounts=[{"namespace": "ml", "name": "placer"}],
        )
    )
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == READER)
    assert role["rules"] == READER_RULES
    binding = next(
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == READER
    )
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": READER,
    }
    assert binding["subjects"] == [
        {"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "ml-team"},
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
        {"kind": "ServiceAccount", "name": "placer", "namespace": "ml"},
    ]
    by_default = {f"{d['kind']}/{d['metadata']['name']}" for d in render()}
    assert f"ClusterRole/{READER}" in by_default
    assert f"ClusterRoleBinding/{READER}" not in by_default  # no subjects, no binding
    without_rbac = render("rbac.create=false", readers_value(groups=["ml-team"]))
    assert not [d for d in without_rbac if d["metadata"]["name"] == READER]
