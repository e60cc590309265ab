"""LabelSelector (headroom.api.selectors): matching as ``kubectl get -l`` does, and the
model refusing what the API server's own validation refuses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from headroom.api.selectors import LabelSelector, LabelSelectorRequirement

LABELS = {"team": "ml", "tier": "gold", "kubernetes.io/metadata.name": "ml"}


def expression(key: str, operator: str, *values: str) -> LabelSelector:
    return LabelSelector.model_validate(
        {
            "matchExpressions": [
                {"key": key, "operator": operator, **({"values": list(values)} if values else {})}
            ]
        }
    )


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        (LabelSelector(), {}, True),  # empty: everything
        (LabelSelector(), LABELS, True),
        (LabelSelector.model_validate({"matchLabels": {}, "matchExpressions": []}), {}, True),
        (LabelSelector(match_labels={"team": "ml"}), LABELS, True),
        (LabelSelector(match_labels={"team": "web"}), LABELS, False),
        (LabelSelector(match_labels={"team": "ml"}), {}, False),
        (LabelSelector(match_labels={"team": "ml", "tier": "gold"}), LABELS, True),
        (LabelSelector(match_labels={"team": "ml", "tier": "silver"}), LABELS, False),
        (LabelSelector(match_labels={"team": ""}), {"team": ""}, True),
        (LabelSelector(match_labels={"team": ""}), {}, False),
        (expression("team", "In", "ml", "web"), LABELS, True),
        (expression("team", "In", "web"), LABELS, False),
        (expression("team", "In", "ml"), {}, False),  # In needs the label
        (expression("team", "NotIn", "web"), LABELS, True),
        (expression("team", "NotIn", "ml", "web"), LABELS, False),
        (expression("team", "NotIn", "ml"), {}, True),  # NotIn holds without the label
        (expression("team", "Exists"), LABELS, True),
        (expression("team", "Exists"), {"team": ""}, True),
        (expression("team", "Exists"), {"other": "ml"}, False),
        (expression("team", "DoesNotExist"), LABELS, False),
        (expression("team", "DoesNotExist"), {"other": "ml"}, True),
        (expression("kubernetes.io/metadata.name", "In", "ml"), LABELS, True),
        (expression("Team", "Exists"), LABELS, False),  # keys are case-sensitive
    ],
)
def test_a_selector_matches_as_kubectl_does(
    selector: LabelSelector, labels: dict[str, str], matches: bool
) -> None:
    assert selector.matches(labels) is matches


def test_every_requirement_and_every_label_must_hold() -> None:
    selector = LabelSelector.model_validate(
        {
            "matchLabels": {"team": "ml"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gold", "silver"]},
                {"key": "frozen", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.matches(LABELS)
    assert not selector.matches({**LABELS, "frozen": "yes"})
    assert not selector.matches({**LABELS, "tier": "bronze"})
    assert not selector.matches({**LABELS, "team": "web"})


def test_describe_writes_the_selector_as_kubectl_get_l_reads_it() -> None:
    assert LabelSelector().describe() == "{}"
    selector = LabelSelector.model_validate(
        {
            "matchLabels": {"tier": "gold", "pool": "gpu"},
            "matchExpressions": [
                {"key": "team", "operator": "In", "values": ["ml", "web"]},
                {"key": "zone", "operator": "NotIn", "values": ["a"]},
                {"key": "gpu", "operator": "Exists"},
                {"key": "frozen", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector.describe() == ("pool=gpu,tier=gold,team in (ml,web),zone notin (a),gpu,!frozen")


def test_the_wire_names_and_the_python_names_both_build_it() -> None:
    wire = LabelSelector.model_validate(
        {"matchLabels": {"team": "ml"}, "matchExpressions": [{"key": "a", "operator": "Exists"}]}
    )
    python = LabelSelector(
        match_labels={"team": "ml"},
        match_expressions=[LabelSelectorRequirement(key="a", operator="Exists")],
    )
    assert wire == python
    assert wire.model_dump(by_alias=True, exclude_none=True) == {
        "matchLabels": {"team": "ml"},
        "matchExpressions": [{"key": "a", "operator": "Exists"}],
    }


@pytest.mark.parametrize(
    "spec",
    [
        {"matchLabels": {"bad key!": "x"}},
        {"matchLabels": {"team": "not a value"}},
        {"matchLabels": {"team": "x" * 64}},
        {"matchExpressions": [{"key": "team", "operator": "Like", "values": ["ml"]}]},
        {"matchExpressions": [{"key": "-team", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "team", "operator": "In", "values": ["-ml"]}]},
        {"matchSomething": {}},
    ],
)
def test_what_the_api_server_refuses_the_model_refuses(spec: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        LabelSelector.model_validate(spec)
