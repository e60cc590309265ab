"""The lock (requirements/*.txt) and pyproject.toml agree (issue 23, item 7).

The image and CI install the lock's exact versions and hashes; pyproject.toml says
what the project accepts. A dependency added, dropped or re-bounded in one and not
the other fails here, offline, naming it: run ``make lock``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(name: str) -> dict[str, str]:
    text = (ROOT / "requirements" / name).read_text()
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==(\S+?)\s*\\?$", text, re.MULTILINE)
    assert found, f"requirements/{name} pins nothing"
    assert text.count("--hash=sha256:") >= len(found), f"requirements/{name}: a pin lacks hashes"
    return {canonicalize_name(n): v for n, v in found}


def check(requirements: list[str], pinned: dict[str, str], lock: str) -> None:
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{text!r} is in pyproject.toml but not in {lock}: make lock"
        version = pinned[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{lock} pins {name}=={version}, outside pyproject.toml's {text!r}: make lock"
        )


def test_the_image_lock_satisfies_the_runtime_dependencies() -> None:
    check(PROJECT["dependencies"], pins("runtime.txt"), "requirements/runtime.txt")


def test_the_ci_lock_satisfies_every_dependency_and_agrees_with_the_image() -> None:
    dev, runtime = pins("dev.txt"), pins("runtime.txt")
    check(PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"], dev, "dev.txt")
    differ = {n: (v, dev.get(n)) for n, v in runtime.items() if dev.get(n) != v}
    assert not differ, f"the image and CI would run different versions: {differ}; make lock"


def test_the_lock_holds_nothing_the_project_never_asked_for() -> None:
    """Every pin is there because of a dependency (pip-compile's "# via" comments)."""
    text = (ROOT / "requirements" / "runtime.txt").read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n\n", 1)[-1])
    orphans = [b.split("==")[0] for b in blocks if "==" in b and "# via" not in b]
    assert not orphans, f"pinned with no reason: {orphans}; make lock"
