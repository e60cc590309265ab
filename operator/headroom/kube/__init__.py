"""The only layer that talks to the Kubernetes API server."""
