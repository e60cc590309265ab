"""Claim node memory from a program (the library is built up in the next commits).

It talks to the API server with the official ``kubernetes`` client, as
``kubectl headroom`` does, from a kubeconfig or from inside a pod; never with the
operator's own code.
"""
