"""The docs hold together: every relative link in README.md and docs/ leads to a file
and a heading that exist, every doc is reachable from docs/README.md, and the
reference pages name every CRD field, every label or annotation the code uses and
every Event reason the operator may post.

The diagrams say what the code says, so a new phase or a new layer cannot leave a
picture behind: the phases diagram has every ``Phase`` as a state and no other, and
the layers diagram has every module of import-linter's layers contract, names no
module that does not exist, and draws no arrow up the layers.

Links are read as GitHub renders them: outside code, a heading's anchor is its text
lower-cased, stripped of punctuation but ``-`` and ``_``, spaces made ``-``, and a
repeated anchor numbered ``-1``, ``-2``....
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml

from headroom.api import constants
from headroom.api.reasons import EventReason, Phase, Reason

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
#: Written by other helpers of issue 23 in parallel (metric names, metrics security,
#: alerts): linked already, and missing until their branches are merged. Each entry
#: must go once its file exists (a test below fails until it does), so this never
#: hides a broken link for long.
AWAITED: set[Path] = set()

FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)
MERMAID = re.compile(r"^```mermaid\n(.*?)^```", re.DOTALL | re.MULTILINE)
#: A state diagram's transition ``A --> B: label``: its two ends (``[*]`` is start or end).
TRANSITION = re.compile(r"^\s*(\S+)\s*-->\s*([^:\s]+)", re.MULTILINE)
#: A flowchart's box ``id["label"]`` and arrow ``a --> b`` (or ``a -.->|"label"| b``).
BOX = re.compile(r'^\s*(\w+)\["([^"]*)"\]', re.MULTILINE)
ARROW = re.compile(r"^\s*(\w+)\s*-\.?-+>\s*(?:\|[^|]*\|\s*)?(\w+)\s*$", re.MULTILINE)
MODULE = re.compile(r"\bheadroom\.\w+")

#: A row of docs/reference/events.md's tables: reason, posted on, type, meaning.
EVENT_ROW = re.compile(r"^\| `([^`]+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", re.MULTILINE)
#: The kinds an Event may be about (``involvedObject.kind``).
EVENT_KINDS = {"Reservation", "Pod", "Node", "HeadroomQuota", "NodeHeadroom"}


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced code blocks (headings and links in code are not ones)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, heading in HEADING.findall(prose(page.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Path) -> list[str]:
    return LINK.findall(INLINE_CODE.sub("", prose(page.read_text())))


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:


def broken(page: Path, target: str) -> str | None:
    """Why ``target``, linked from ``page``, leads nowhere; None when it leads somewhere."""
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.exists():
        return None if file in AWAITED and not anchor else f"no file {file.relative_to(ROOT)}"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"no heading #{anchor} in {file.relative_to(ROOT)}"
    return None


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_a_heading(page: Path) -> None:
    found = [
        f"{target}: {why}"
        for target in links(page)
        if relative(target) and (why := broken(page, target)) is not None
    ]
    assert not found, f"{page.relative_to(ROOT)}: " + "; ".join(found)


def test_every_code_fence_is_closed() -> None:
    """An unclosed fence turns the rest of the page into code on GitHub: its headings
    are no anchors, so links to them lead nowhere (api.md's first example had one)."""
    unclosed = [
        str(page.relative_to(ROOT))
        for page in pages()
        if sum(1 for line in page.read_text().splitlines() if line.lstrip().startswith("```")) % 2
    ]
    assert not unclosed, f"a code fence is never closed in {unclosed}"


def test_every_doc_is_reachable_from_the_index() -> None:
    reached, todo = {INDEX}, [INDEX]
    while todo:
        page = todo.pop()
        for target in links(page):
            path = target.partition("#")[0]
            if not relative(target) or not path.endswith(".md"):
                continue
            file = (page.parent / path).resolve()
            if file.is_relative_to(DOCS) and file.exists() and file not in reached:
                reached.add(file)
                todo.append(file)
    unreached = sorted(str(p.relative_to(ROOT)) for p in DOCS.rglob("*.md") if p not in reached)
    assert not unreached, f"not linked from docs/README.md, directly or not: {unreached}"


def test_the_readme_links_the_index() -> None:
    assert "docs/README.md" in links(ROOT / "README.md")


def test_awaited_docs_are_still_awaited() -> None:
    """Once another branch brought one of them, it leaves AWAITED: checked like any doc."""
    arrived = sorted(str(p.relative_to(ROOT)) for p in AWAITED if p.exists())
    assert not arrived, f"remove from AWAITED in {Path(__file__).name}: {arrived}"


def crd_fields() -> dict[str, list[str]]:
    """Every field path under spec and status of each CRD, by kind."""
    fields: dict[str, list[str]] = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        out = fields.setdefault(crd["spec"]["names"]["kind"], [])

        def walk(node: dict[str, object], prefix: str, out: list[str] = out) -> None:
            if node.get("type") == "array" and isinstance(node.get("items"), dict):
                walk(node["items"], prefix + "[]")  # type: ignore[arg-type]
                return
            for key, sub in (node.get("properties") or {}).items():  # type: ignore[attr-defined]
                out.append(f"{prefix}.{key}")
                walk(sub, f"{prefix}.{key}")

        for top in ("spec", "status"):
            if top in schema["properties"]:
                walk(schema["properties"][top], top)
    return fields


def test_the_api_reference_names_every_field_of_every_kind() -> None:
    text = (DOCS / "reference" / "api.md").read_text()
    missing = [
        f"{kind} {field}"
        for kind, fields in crd_fields().items()
        for field in fields
        if f"`{field}`" not in text
    ]
    assert not missing, f"docs/reference/api.md lacks: {missing}"


def test_the_annotations_reference_names_every_label_and_annotation() -> None:
    text = (DOCS / "reference" / "annotations.md").read_text()
    names = {
        value
        for name, value in vars(constants).items()
        if name.isupper()
        and isinstance(value, str)
        and value.startswith(f"{constants.GROUP}/")
        and value != constants.API_VERSION
    }
    assert names, "no names found in headroom.api.constants"
    missing = sorted(n for n in names if f"`{n}" not in text)
    assert not missing, f"docs/reference/annotations.md lacks: {missing}"


def diagram(page: Path, kind: str) -> str:
    """The one Mermaid diagram of ``kind`` (its first word) on ``page``."""
    found = [block for block in MERMAID.findall(page.read_text()) if block.split()[0] == kind]
    assert len(found) == 1, f"{page.relative_to(ROOT)}: {len(found)} {kind} diagrams, not 1"
    return found[0]


def test_the_phases_diagram_has_every_phase_and_no_other_state() -> None:
    text = diagram(DOCS / "concepts" / "decisions.md", "stateDiagram-v2")
    states = {end for transition in TRANSITION.findall(text) for end in transition} - {"[*]"}
    phases = {str(phase) for phase in Phase}
    assert states == phases, (
        f"docs/concepts/decisions.md: states without a Phase: {sorted(states - phases)}; "
        f"phases without a state: {sorted(phases - states)}"
    )


def layers() -> list[list[str]]:
    """import-linter's layers of the package, top first, each the modules it names
    (siblings share one); not the layers inside one package (a contract with containers)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [
        c for c in config["contracts"] if c["type"] == "layers" and "containers" not in c
    ]
    return [re.findall(r"[\w.]+", layer) for layer in contract["layers"]]


def boxes() -> dict[str, str]:
    """The layers diagram's boxes: id -> the module its label names."""
    text = diagram(DOCS / "development" / "layout.md", "flowchart")
    return {box: found[0] for box, label in BOX.findall(text) if (found := MODULE.findall(label))}


def test_the_layers_diagram_draws_every_layer() -> None:
    modules = [module for layer in layers() for module in layer]
    assert modules, "the layers contract in pyproject.toml names no module"
    drawn = set(boxes().values())
    missing = [module for module in modules if module not in drawn]
    assert not missing, f"docs/development/layout.md: no box for {missing}"


def test_the_layers_diagram_names_only_modules_that_exist() -> None:
    text = diagram(DOCS / "development" / "layout.md", "flowchart")
    package = ROOT / "operator" / "headroom"
    invented = sorted(
        module
        for module in set(MODULE.findall(text))
        if not (package / module.split(".")[1]).is_dir()
        and not (package / f"{module.split('.')[1]}.py").is_file()
    )
    assert not invented, f"docs/development/layout.md names modules that do not exist: {invented}"


def test_the_layers_diagram_draws_no_arrow_up_the_layers() -> None:
    """An arrow is "may import": between two layers it points to a lower one."""
    depth = {module: index for index, layer in enumerate(layers()) for module in layer}
    named = boxes()
    text = diagram(DOCS / "development" / "layout.md", "flowchart")
    arrows = [(named.get(a), named.get(b)) for a, b in ARROW.findall(text)]
    between = [(a, b) for a, b in arrows if a in depth and b in depth]
    assert between, "no arrow between two layers found: is the diagram still parsed?"
    upward = [f"{a} --> {b}" for a, b in between if depth[a] >= depth[b]]
    assert not upward, f"docs/development/layout.md: arrows that do not go down: {upward}"


def test_event_reasons_are_one_closed_set() -> None:
    """An Event reason is a ledger Reason or an EventReason, never both: one word, one meaning."""
    both = sorted({r.value for r in Reason} & {r.value for r in EventReason})
    assert not both, f"in both Reason and EventReason: {both}"


def test_the_events_reference_documents_every_reason_and_only_those() -> None:
    """docs/reference/events.md has one row per member of Reason and EventReason (every
    reason the recorder accepts), each saying on which object and Normal or Warning,
    and no row for a reason that is no member."""
    rows = EVENT_ROW.findall((DOCS / "reference" / "events.md").read_text())
    documented = [reason for reason, *_ in rows]
    members = {r.value for r in Reason} | {r.value for r in EventReason}
    assert len(documented) == len(set(documented)), "a reason documented twice"
    assert members - set(documented) == set(), "posted, not documented"
    assert set(documented) - members == set(), "documented, not a member"
    for reason, on, kind, meaning in rows:
        kinds = {k.strip() for k in on.split(",")}
        assert kinds <= EVENT_KINDS, f"{reason}: posted on {on!r}"
        assert kind.strip() in ("Normal", "Warning"), f"{reason}: type {kind!r}"
        assert meaning.strip().endswith("."), f"{reason}: its meaning is one sentence"
