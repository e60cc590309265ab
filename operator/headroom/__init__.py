"""Headroom: a reservation ledger of node RAM and VRAM, run as a Kubernetes operator.

Layers, outermost first (enforced by import-linter, see pyproject.toml):
``handlers`` (kopf wiring) -> ``kube`` (the only code that talks to the API server)
-> ``ledger`` (pure arithmetic, no I/O) -> ``api`` (pydantic models and reasons).
"""
