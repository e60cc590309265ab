"""kopf wiring: thin handlers that call the ledger through the kube layer."""
