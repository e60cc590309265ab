//go:build tools

// Package tools pins the command this module exists to build.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
