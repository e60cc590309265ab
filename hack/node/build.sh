#!/usr/bin/env bash
# Build the node binaries (today: the kubelet) from the pinned wrapper module
# hack/controlplane/kubelet, into the same cache as hack/controlplane/build.sh:
# $HEADROOM_CACHE/bin/kubelet-<version>-<pin hash>/kubelet, linked from
# $HEADROOM_CACHE/bin/current/kubelet. Kept out of hack/controlplane/build.sh on
# purpose: `make dev` must not pay for the node (issue #12, item 6).
# There is no fallback: a missing toolchain or a failed build exits non-zero.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/../controlplane/kubelet"
cache="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
current="$cache/bin/current"

command -v go >/dev/null || { echo "hack/node/build.sh: 'go' is not on PATH; Go 1.26+ is required" >&2; exit 1; }

# The kubelet builds with CGO_ENABLED=0 (checked: v1.35.4, Go 1.26); the
# static binary has no libc dependency.
export CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$current"

version="$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
major="${version#v}"; major="${major%%.*}"
minor="${version#v*.}"; minor="${minor%%.*}"
hash="$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-8)"
dir="$cache/bin/kubelet-$version-$hash"
if [[ ! -x "$dir/kubelet" ]]; then
  echo "building kubelet $version (first time takes minutes) ..." >&2
  start=$SECONDS ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X '$pkg.gitVersion=$version' -X '$pkg.gitMajor=$major' -X '$pkg.gitMinor=$minor'"
    ldflags+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=1970-01-01T00:00:00Z'"
  done
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$dir.tmp/kubelet" k8s.io/kubernetes/cmd/kubelet)
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  echo "built kubelet $version in $((SECONDS - start))s: $(du -h "$dir/kubelet" | cut -f1)" >&2
fi
ln -sfn "$dir/kubelet" "$current/kubelet"
echo "$current/kubelet"
