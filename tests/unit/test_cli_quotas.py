"""``fit`` and ``summary`` with HeadroomQuotas, the cluster stood in for: which quotas
govern a namespace, the refusal in the operator's words, a node outside a quota's
nodeSelector, and quotas that cannot be read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from headroom.cli import kubectl_main, readers
from headroom.cli import quotaview as q
from headroom.client import Connection, calls
from headroom.client.placement import assess
from tests.unit.test_client_pure import headroom

GIB = 1024


def quota(
    name: str = "team-ml",
    selector: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": (
                selector
                if selector is not None
                else {"matchLabels": {"kubernetes.io/metadata.name": "ml"}}
            ),
            **spec,
        },
    }
    if status is not None:
        obj["status"] = status
    return obj


def usage(ram_mb: int = 0, vram_mb: int = 0, entries: int = 0, *namespaces: str) -> dict[str, Any]:
    return {
        "ramMB": ram_mb,
        "vramMB": vram_mb,
        "entries": entries,
        "namespaceCount": len(namespaces),
        "namespaces": [{"namespace": n, "ramMB": 0, "vramMB": 0, "entries": 0} for n in namespaces],
    }


def labelled(name: str, labels: dict[str, str], **status: Any) -> dict[str, Any]:
    node = headroom(name, **status)
    node["metadata"]["labels"] = labels
    return node


# -- pure -------------------------------------------------------------------------------------


def test_a_quota_governs_the_namespaces_its_status_lists() -> None:
    by_team = {"matchLabels": {"team": "ml"}}  # namespace labels: the tenant cannot read them
    listed = q.parse(quota(selector=by_team, status=usage(0, 0, 0, "ml", "ml-dev")))
    assert q.governs(listed, "ml")
    assert q.governs(listed, "ml-dev")
    assert not q.governs(listed, "web")
    # Before the operator wrote a status: the selector, against the namespace's name label.
    by_name = q.parse(quota())
    assert q.governs(by_name, "ml")
    assert not q.governs(by_name, "web")
    assert not q.governs(q.parse(quota(selector=by_team)), "ml")  # cannot tell: not governed
    assert q.governs(q.parse(quota(selector={})), "anything")
    assert q.governs(q.parse(quota(selector={}, status=usage())), "anything")  # empty list
    # A list cut short (namespaceCount above it): the selector decides the rest.
    cut = usage(0, 0, 0, "a")
    cut["namespaceCount"] = 5
    assert q.governs(q.parse(quota(status=cut)), "ml")
    assert [x.name for x in q.governing([listed, by_name], "ml-dev")] == ["team-ml"]


def test_the_refusal_is_worded_as_the_operator_words_it() -> None:
    full = q.parse(quota(ramMB=64 * GIB, status=usage(56 * GIB, 0, 3, "ml")))
    assert q.refusal(full, "ml", 16 * GIB, 0) == (
        "namespace ml (quota team-ml): holds 56 GiB of 64 GiB RAM; requested 16 GiB"
    )
    assert q.refusal(full, "ml", 8 * GIB, 0) is None  # exactly to the limit
    vram = q.parse(quota(vramMB=8 * GIB, status=usage(0, 7000, 1, "ml")))
    assert q.refusal(vram, "ml", 0, 2048) == (
        "namespace ml (quota team-ml): holds 7000 MiB of 8 GiB VRAM; requested 2 GiB"
    )
    assert q.refusal(vram, "ml", 100 * GIB, 0) is None  # no RAM limit
    capped = q.parse(quota(maxEntries=3, status=usage(0, 0, 3, "ml")))
    assert q.refusal(capped, "ml", 0, 0) == (
        "namespace ml (quota team-ml): holds 3 of 3 entries (spec.maxEntries)"
    )
    assert q.refusal(q.parse(quota()), "ml", 10**6, 10**6) is None  # no limits at all


def test_a_quota_that_cannot_be_used_refuses_everything() -> None:
    invalid = quota(status={**usage(0, 0, 0, "ml"), "valid": False, "message": "bad\n selector"})
    assert q.refusal(q.parse(invalid), "ml", 1, 0) == (
        "namespace ml (quota team-ml): the quota cannot be used: bad selector"
    )
    unreadable = q.parse(quota(ramMB=-5))
    assert unreadable.spec is None
    assert q.refusal(unreadable, "ml", 1, 0) == (
        "namespace ml (quota team-ml): the quota cannot be used: "
        "spec.ramMB: Input should be greater than or equal to 0"
    )
    later = q.parse(quota(ramMB=1024, someFieldAddedLater=True, status={"newFigure": 1}))
    assert later.spec is not None
    assert later.spec.ram_mb == 1024


def test_a_node_outside_the_node_selector_is_named_with_the_selector() -> None:
    pool = {
        "matchLabels": {"pool": "gpu"},
        "matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}],
    }
    gpu_only = q.parse(quota(nodeSelector=pool))
    assert q.node_refusal(gpu_only, "ml", "cpu-1", {"pool": "cpu"}) == (
        "namespace ml (quota team-ml): node cpu-1 is outside spec.nodeSelector (pool=gpu,!spot)"
    )
    assert q.node_refusal(gpu_only, "ml", "gpu-1", {"pool": "gpu"}) is None
    assert q.node_refusal(q.parse(quota()), "ml", "cpu-1", {}) is None
    fits = assess(headroom("cpu-1"), 1024, 0)
    assert fits.fits
    assert q.within(fits, [gpu_only], "ml", {"pool": "gpu"}) is fits
    room = q.within(fits, [gpu_only], "ml", {"pool": "cpu"})
    assert (room.fits, room.could_fit_later) == (False, False)
    assert room.why_not is not None
    assert "outside spec.nodeSelector" in room.why_not


def test_the_quota_rows_show_held_of_limit() -> None:
    rows = q.rows(
        [
            q.parse(
                quota(
                    ramMB=64 * GIB,
                    maxEntries=10,
                    status={**usage(57344, 0, 3, "ml"), "queued": 1, "over": False},
                )
            ),
            q.parse(quota("lowered", vramMB=100, status={**usage(0, 200, 1), "over": True})),
            q.parse(quota("broken", ramMB=-1)),
        ]
    )
    assert rows == [
        ["team-ml", "57344/65536", "0/-", "3/10", 1, "false"],
        ["lowered", "0/-", "200/100", "1/-", 0, "true"],
        ["broken (invalid)", "0/-", "0/-", "0/-", 0, "false"],
    ]


# -- fit and summary, with the cluster stood in for ------------------------------------------


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """NodeHeadrooms and quotas as fit and summary read them: fill the lists, or set
    ``quotas`` to an ApiException to refuse them."""
    state: dict[str, Any] = {"headrooms": [], "quotas": [], "reservations": []}

    def quotas(conn: Connection) -> list[dict[str, Any]]:
        if isinstance(state["quotas"], ApiException):
            raise state["quotas"]
        return list(state["quotas"])

    def connect(config: str | None, context: str | None, namespace: str | None) -> Connection:
        return Connection(None, namespace or "ml")  # type: ignore[arg-type]

    monkeypatch.setattr(readers, "connect", connect)
    monkeypatch.setattr(calls, "node_headrooms", lambda conn, selector=None: state["headrooms"])
    monkeypatch.setattr(readers, "node_headrooms", lambda conn: state["headrooms"])
    monkeypatch.setattr(readers, "reservations", lambda conn, ns: state["reservations"])
    monkeypatch.setattr(readers, "quotas", quotas)
    return state


def forbidden() -> ApiException:
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps(
        {"message": 'headroomquotas.headroom.dev is forbidden: User "tenant" cannot list'}
    )
    return error


def test_fit_says_the_quota_refuses_not_the_nodes(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster["headrooms"] += [headroom("n1"), headroom("n2")]
    cluster["quotas"] += [quota(ramMB=64 * GIB, status=usage(56 * GIB, 0, 3, "ml"))]
    assert kubectl_main(["fit", "--ram", str(16 * GIB)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == (
        "Error: namespace ml (quota team-ml): holds 56 GiB of 64 GiB RAM; requested 16 GiB "
        "(2 nodes have room for 16384 MiB RAM: the quota refuses, not the nodes)\n"
    )
    assert kubectl_main(["fit", "--ram", str(8 * GIB)]) == 0  # the rest of its room fits
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [
        "NODE",
        "n1",
        "n2",
    ]
    # Another namespace is not governed by it.
    assert kubectl_main(["fit", "--ram", str(16 * GIB), "-n", "web"]) == 0
    # Neither the quota nor any node: both are said.
    assert kubectl_main(["fit", "--ram", "40000"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: namespace ml (quota team-ml): holds 56 GiB of 64 GiB RAM; ")
    assert "; and no node has room for 40000 MiB RAM now (n1: allocatable 31744 MiB" in err


def test_fit_leaves_out_the_nodes_a_quota_does_not_allow(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster["headrooms"] += [
        labelled("big-cpu", {"pool": "cpu"}),
        labelled("gpu-1", {"pool": "gpu"}, allocatableRAMMB=8000),
    ]
    cluster["quotas"] += [quota(nodeSelector={"matchLabels": {"pool": "gpu"}})]
    assert kubectl_main(["fit", "--ram", "4096", "-o", "json"]) == 0
    assert [room["node"] for room in json.loads(capsys.readouterr().out)] == ["gpu-1"]
    assert kubectl_main(["fit", "--ram", "10000"]) == 1
    assert capsys.readouterr().err == (
        "Error: no node has room for 10000 MiB RAM now (big-cpu: namespace ml (quota team-ml): "
        "node big-cpu is outside spec.nodeSelector (pool=gpu); gpu-1: allocatable 8000 MiB "
        "< 10000 MiB)\n"
    )


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (forbidden(), "HeadroomQuotas not readable (headroomquotas.headroom.dev is forbidden"),
        (ApiException(status=404, reason="Not Found"), "HeadroomQuotas are not served here"),
    ],
)
def test_fit_goes_on_without_quotas_it_cannot_read(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str], error: ApiException, said: str
) -> None:
    cluster["headrooms"].append(headroom("n1"))
    cluster["quotas"] = error
    assert kubectl_main(["fit", "--ram", "1024"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[1].split()[0] == "n1"
    (warning,) = out.err.splitlines()
    assert warning.startswith(f"Warning: {said}"), warning
    assert "quotas not checked" in warning
    if error.status == 403:
        assert warning.endswith(q.QUOTA_GRANT)


def test_summary_has_a_quotas_section_when_any_is_readable(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster["headrooms"].append(headroom("n1"))
    assert kubectl_main(["summary"]) == 0
    assert "QUOTA" not in capsys.readouterr().out  # none: no section
    cluster["quotas"].append(
        quota(ramMB=64 * GIB, status={**usage(57344, 0, 3, "ml"), "queued": 2})
    )
    assert kubectl_main(["summary"]) == 0
    text = capsys.readouterr().out
    section = text.split("\n\n")[1].splitlines()
    assert section[0].split() == [
        "QUOTA",
        "RAM",
        "(MiB)",
        "VRAM",
        "(MiB)",
        "ENTRIES",
        "QUEUED",
        "OVER",
    ]
    assert section[1].split() == ["team-ml", "57344/65536", "0/-", "3/-", "2", "false"]
    assert kubectl_main(["summary", "-o", "json"]) == 0
    (data,) = json.loads(capsys.readouterr().out)["quotas"]
    assert (data["name"], data["ramMB"], data["ramLimitMB"], data["queued"]) == (
        "team-ml", 57344, 65536, 2,
    )  # fmt: skip
    assert data["namespaces"] == ["ml"]
    cluster["quotas"] = forbidden()
    assert kubectl_main(["summary", "-o", "json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["quotas"] is None
    (warning,) = out.err.splitlines()
    assert "HeadroomQuotas not readable" in warning
    assert "quotas not shown" in warning


def test_a_namespace_under_two_quotas_is_bound_by_both(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster["headrooms"].append(headroom("n1"))
    cluster["quotas"] += [
        quota("team-ml", ramMB=64 * GIB, status=usage(8 * GIB, 0, 1, "ml")),
        quota("all", selector={}, maxEntries=10, status=usage(8 * GIB, 0, 10, "ml", "web")),
    ]
    assert kubectl_main(["fit", "--ram", "1024"]) == 1
    assert capsys.readouterr().err == (
        "Error: namespace ml (quota all): holds 10 of 10 entries (spec.maxEntries) "
        "(1 node has room for 1024 MiB RAM: the quota refuses, not the nodes)\n"
    )
    cluster["quotas"][0]["spec"]["ramMB"] = 8 * GIB
    assert kubectl_main(["fit", "--ram", "1024"]) == 1
    assert capsys.readouterr().err == (
        "Error: namespace ml (quota all): holds 10 of 10 entries (spec.maxEntries); "
        "namespace ml (quota team-ml): holds 8 GiB of 8 GiB RAM; requested 1 GiB "
        "(1 node has room for 1024 MiB RAM: the quotas refuse, not the nodes)\n"
    )
