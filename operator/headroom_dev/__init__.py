"""Development and test support for Headroom: a real local control plane.

Nothing here is imported by the operator. It exists so that the test suite and
``make dev`` run against a genuine kube-apiserver + etcd (built from their Go
modules by ``hack/controlplane/build.sh``) instead of a mock.
"""
