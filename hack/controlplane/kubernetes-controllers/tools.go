//go:build tools

// Package tools pins the commands this module exists to build. They are built
// only on demand (build.sh kube-controller-manager kube-scheduler).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
