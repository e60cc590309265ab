"""Generated files match their source: the CRDs in crds/ come from the models."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_crds_match_the_models() -> None:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "hack" / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    expected = generate.rendered(with_manifests=False)  # manifests: make verify, chart tests
    assert {p.name for p in expected} == {p.name for p in (ROOT / "crds").glob("*.yaml")}
    for path, text in expected.items():
        assert path.read_text() == text, f"{path} drifted from the models: run `make generate`"
