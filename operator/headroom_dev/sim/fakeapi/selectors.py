"""Label selectors as the API server parses them: ``k=v``, ``k==v``, ``k!=v``, ``k``,
``!k``, ``k in (a,b)``, ``k notin (a,b)``, comma-separated (all must hold).

A selector that does not parse is a 400 BadRequest, as on the real server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from headroom.kube.transport import ApiError

Matcher = Callable[[Mapping[str, str] | None], bool]

_REQUIREMENT = re.compile(
    r"""^\s*(?:
        (?P<not>!)\s*(?P<nkey>[A-Za-z0-9][-A-Za-z0-9_./]*)
      | (?P<key>[A-Za-z0-9][-A-Za-z0-9_./]*)\s*
        (?:(?P<op>==|=|!=)\s*(?P<value>[-A-Za-z0-9_.]*)
          |\s(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?
    )\s*$""",
    re.VERBOSE,
)
_CACHE: dict[str, Matcher] = {}


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _requirement(text: str) -> Matcher:
    match = _REQUIREMENT.match(text)
    if match is None:
        raise ApiError(400, "BadRequest", f"unable to parse requirement: {text.strip()!r}")
    if match["not"]:
        absent = match["nkey"]
        return lambda labels: not labels or absent not in labels
    key = match["key"]
    if match["op"]:
        value = match["value"]
        if match["op"] == "!=":
            return lambda labels: not labels or labels.get(key) != value
        return lambda labels: bool(labels) and labels.get(key) == value  # type: ignore[union-attr]
    if match["setop"]:
        values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
        if match["setop"] == "in":
            return lambda labels: bool(labels) and labels.get(key) in values  # type: ignore[union-attr]
        return lambda labels: not labels or labels.get(key) not in values
    return lambda labels: bool(labels) and key in labels  # type: ignore[operator]


def parse_selector(selector: str | None) -> Matcher | None:
    """A predicate over an object's labels; None for no selector (everything matches)."""
    if not selector or not selector.strip():
        return None
    cached = _CACHE.get(selector)
    if cached is not None:
        return cached
    requirements = [_requirement(part) for part in _split(selector)]

    def matches(labels: Mapping[str, str] | None) -> bool:
        return all(requirement(labels) for requirement in requirements)

    if len(_CACHE) < 1024:
        _CACHE[selector] = matches
    return matches
