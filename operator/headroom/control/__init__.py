"""Control: the reconcile loop that keeps Reservations, Nodes and the ledger in agreement.

Talks to the API only through ``headroom.kube.transport.Transport`` and reads
time only from an injected ``Clock``, so that the deterministic simulation
(``headroom_dev.sim``) drives exactly this code.
"""
