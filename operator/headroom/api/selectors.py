"""Label selectors (``metav1.LabelSelector``), as a model and as a match.

A HeadroomQuota picks its namespaces and its nodes with label selectors, written
as Kubernetes writes them everywhere (Deployments, Kueue's ClusterQueue):
``matchLabels`` and ``matchExpressions`` with ``In``, ``NotIn``, ``Exists`` and
``DoesNotExist``, all of them ANDed; an empty selector matches everything. The
schema refuses at ``kubectl apply`` what the API server's own validation would
refuse (a bad key or value, ``In`` without values), so a selector that reaches
the operator matches the way ``kubectl get -l`` does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue

from headroom.api.constants import MAX_SELECTOR_TERMS

#: A qualified label key: an optional DNS-subdomain prefix and a name of up to 63.
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
LabelKey = Annotated[str, Field(min_length=1, max_length=317, pattern=LABEL_KEY)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]


def _label_key(key: str) -> str:
    if not (0 < len(key) <= 317 and re.fullmatch(LABEL_KEY, key)):
        raise ValueError(f"label key {key[:320]!r} must be a qualified name ({LABEL_KEY})")
    return key


#: A map key: a structural schema cannot constrain one, so a CEL rule on the map does.
MapLabelKey = Annotated[str, AfterValidator(_label_key)]
_KEYS_RULE: dict[str, JsonValue] = {
    "rule": f"self.all(k, size(k) <= 317 && k.matches(r'{LABEL_KEY}'))",
    "message": "label keys must be qualified names (an optional DNS prefix and a name)",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class LabelSelectorRequirement(_Model):
    """One requirement on a label: ``key operator values``."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.operator in ['In', 'NotIn'] ? "
                    "(has(self.values) && size(self.values) > 0) : "
                    "(!has(self.values) || size(self.values) == 0)",
                    "message": "values must be non-empty for In and NotIn, "
                    "and empty for Exists and DoesNotExist",
                    "fieldPath": ".values",
                }
            ]
        }
    )

    key: LabelKey = Field(description="The label key the requirement applies to.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    values: list[LabelValue] | None = Field(
        None,
        max_length=MAX_SELECTOR_TERMS,
        description="Values for In and NotIn; none for Exists and DoesNotExist.",
    )


class LabelSelector(_Model):
    """Objects whose labels satisfy every requirement. Empty: every object."""

    match_labels: dict[MapLabelKey, LabelValue] | None = Field(
        None,
        alias="matchLabels",
        max_length=MAX_SELECTOR_TERMS,
        json_schema_extra={"x-kubernetes-validations": [_KEYS_RULE]},
        description="Labels that must be present with exactly these values.",
    )
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        None,
        alias="matchExpressions",
        max_length=MAX_SELECTOR_TERMS,
        description="Requirements that must all hold.",
    )

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in (self.match_labels or {}).items():
            if labels.get(key) != value:
                return False
        return all(_holds(r, labels) for r in self.match_expressions or ())

    def describe(self) -> str:
        """The selector as ``kubectl get -l`` writes it (``{}`` matches everything)."""
        parts = [f"{k}={v}" for k, v in sorted((self.match_labels or {}).items())]
        for requirement in self.match_expressions or ():
            values = ",".join(requirement.values or ())
            parts.append(
                {
                    "In": f"{requirement.key} in ({values})",
                    "NotIn": f"{requirement.key} notin ({values})",
                    "Exists": requirement.key,
                    "DoesNotExist": f"!{requirement.key}",
                }[requirement.operator]
            )
        return ",".join(parts) or "{}"


def _holds(requirement: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    present = requirement.key in labels
    if requirement.operator == "Exists":
        return present
    if requirement.operator == "DoesNotExist":
        return not present
    inside = present and labels[requirement.key] in (requirement.values or ())
    return inside if requirement.operator == "In" else not inside
