"""Serving: the operator's HTTP endpoint (probes) and its Prometheus metrics."""
