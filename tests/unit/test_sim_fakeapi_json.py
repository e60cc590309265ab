"""The fake API server's building blocks: JSON copies and patches, label selectors, CEL twins.

Patch semantics that kube-apiserver shows (``replace`` of a missing member adds
it, a failed ``test`` rejects the whole patch as 422) are pinned by the contract
tests; these cover the rest of RFC 6902/7386 and the copies the store relies on.
"""

from __future__ import annotations

import enum

import pytest

from headroom.kube.transport import JSON, ApiError
from headroom_dev.sim.fakeapi.jsonvalue import (
    PatchError,
    apply_json_patch,
    clone,
    json_equal,
    merge_patch,
)
from headroom_dev.sim.fakeapi.schema import _check_rules, crd_schemas
from headroom_dev.sim.fakeapi.selectors import parse_selector
from headroom_dev.sim.loop import DEFAULT_EPOCH


def test_json_patch_operations_and_pointer_escaping() -> None:
    doc = {"a/b": {"m~n": 1}, "list": [1, 2, 3], "flag": True}
    patched = apply_json_patch(
        clone(doc),
        [
            {"op": "test", "path": "/a~1b/m~0n", "value": 1},
            {"op": "add", "path": "/list/1", "value": 9},
            {"op": "add", "path": "/list/-", "value": 4},
            {"op": "remove", "path": "/list/0"},
            {"op": "replace", "path": "/list/0", "value": 8},
            {"op": "copy", "from": "/a~1b", "path": "/copied"},
            {"op": "move", "from": "/flag", "path": "/moved"},
            {"op": "test", "path": "/absent", "value": None},  # missing passes only against null
        ],
    )
    assert patched == {"a/b": {"m~n": 1}, "list": [8, 2, 3, 4], "copied": {"m~n": 1}, "moved": True}
    assert doc["list"] == [1, 2, 3]  # applied to the copy only
    for failing in (
        [{"op": "test", "path": "/flag", "value": 1}],  # JSON: true is not 1
        [{"op": "test", "path": "/absent", "value": "x"}],
        [{"op": "remove", "path": "/absent"}],
        [{"op": "add", "path": "/no/parent", "value": 1}],
        [{"op": "replace", "path": "/list/7", "value": 1}],
        [{"op": "add", "path": "/list/01", "value": 1}],
        [{"op": "bogus", "path": "/flag"}],
        [{"op": "add", "path": "/x"}],
        {"op": "add"},
    ):
        with pytest.raises(PatchError):
            apply_json_patch(clone(doc), failing)


def test_merge_patch_and_copies() -> None:
    target = {"a": {"b": 1, "c": 2}, "list": [1], "keep": "x"}
    patch: JSON = {"a": {"b": None, "d": {"e": 1}}, "list": [2, 3]}
    merged = merge_patch(target, patch)
    assert merged == {"a": {"c": 2, "d": {"e": 1}}, "list": [2, 3], "keep": "x"}
    patch["a"]["d"]["e"] = 99
    assert merged["a"]["d"]["e"] == 1  # the patch's values were copied
    assert target == {"a": {"b": 1, "c": 2}, "list": [1], "keep": "x"}

    class Phase(enum.StrEnum):
        ADMITTED = "Admitted"

    copied = clone({"phase": Phase.ADMITTED, "pair": (1, 2)})
    assert copied == {"phase": "Admitted", "pair": [1, 2]}
    assert type(copied["phase"]) is str
    with pytest.raises(TypeError):
        clone({"when": DEFAULT_EPOCH})  # as json.dumps in the real client
    assert json_equal({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]})
    assert not json_equal({"a": True}, {"a": 1})


def test_label_selectors_parse_as_the_api_server_does() -> None:
    def matches(selector: str, labels: dict[str, str] | None) -> bool:
        matcher = parse_selector(selector)
        assert matcher is not None
        return matcher(labels)

    labels = {"app": "x", "tier": "db"}
    assert matches("app=x", labels)
    assert matches("app==x,tier=db", labels)
    assert not matches("app=x,tier=web", labels)
    assert matches("app!=y", labels)
    assert matches("app!=y", None)
    assert matches("app", labels)
    assert not matches("!app", labels)
    assert matches("!gone", labels)
    assert matches("tier in (web, db)", labels)
    assert matches("tier notin (web)", labels)
    assert not matches("tier notin (web,db)", labels)
    assert matches(" app = x ", labels)
    assert parse_selector("") is None
    for bad in ("a=(b", "=x", "a b", "a in b"):
        with pytest.raises(ApiError) as refused:
            parse_selector(bad)
        assert (refused.value.status, refused.value.reason) == (400, "BadRequest")


def test_every_cel_rule_in_the_crds_has_a_python_twin() -> None:
    assert set(crd_schemas()) == {"reservations", "nodeheadrooms", "headroomquotas"}
    new_rule = {"type": "object", "x-kubernetes-validations": [{"rule": "self.size() < 3"}]}
    with pytest.raises(NotImplementedError, match="add its Python twin"):
        _check_rules({"properties": {"spec": new_rule}}, "reservations")
