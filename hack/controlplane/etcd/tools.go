//go:build tools

// Package tools pins the command this module exists to build.
package tools

import _ "go.etcd.io/etcd/server/v3"
