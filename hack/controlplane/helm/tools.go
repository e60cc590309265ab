//go:build tools

// Package tools pins the command this module exists to build.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
