#!/usr/bin/env bash
# Build the control-plane binaries (kube-apiserver, kubectl, etcd) from the
# pinned wrapper modules beside this script, into a cache outside git.
#
# Usage: build.sh [helm] [kube-controller-manager] [kube-scheduler]
# The named extras are built too, only when asked for (`make helm`, `make
# controllers`), so the default path (`make dev`) does not pay for them (helm
# alone is about 3 minutes cold). The controllers come from
# kubernetes-controllers/, pinned to the same k8s.io/kubernetes as kubernetes/.
#
# Each binary lands in $HEADROOM_CACHE/bin/<name>-<version>-<pin hash>/ and is
# reused while its wrapper module's go.mod/go.sum are unchanged; a new pin builds
# a new directory. $HEADROOM_CACHE/bin/current/<name> links the one in use.
# There is no fallback: a missing toolchain or a failed build exits non-zero.
set -euo pipefail

extras=() with_helm=false
for arg in "$@"; do
  case "$arg" in
    helm) with_helm=true ;;
    kube-controller-manager|kube-scheduler) extras+=("$arg") ;;
    *) echo "build.sh: unknown binary '$arg' (known extras: helm kube-controller-manager kube-scheduler)" >&2; exit 2 ;;
  esac
done

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
current="$cache/bin/current"

command -v go >/dev/null || { echo "build.sh: 'go' is not on PATH; Go 1.26+ is required to build the control plane" >&2; exit 1; }

export CGO_ENABLED=0 GOFLAGS=-mod=mod
mkdir -p "$current"

# build MODULE_DIR NAME PACKAGE VERSION_MODULE [LDFLAGS...]
build() {
  local mod="$1" name="$2" pkg="$3" vmod="$4"; shift 4
  local version hash dir
  version="$(cd "$here/$mod" && go list -m -f '{{.Version}}' "$vmod")"
  hash="$(cat "$here/$mod/go.mod" "$here/$mod/go.sum" | sha256sum | cut -c1-8)"
  dir="$cache/bin/$name-$version-$hash"
  if [[ ! -x "$dir/$name" ]]; then
    echo "building $name $version (first time takes minutes) ..." >&2
    local start=$SECONDS ldflags="-s -w"
    local f; for f in "$@"; do ldflags+=" -X '$f'"; done
    mkdir -p "$dir.tmp"
    (cd "$here/$mod" && go build -trimpath -ldflags "$ldflags" -o "$dir.tmp/$name" "$pkg")
    rm -rf "$dir" && mv "$dir.tmp" "$dir"
    echo "built $name $version in $((SECONDS - start))s: $(du -h "$dir/$name" | cut -f1)" >&2
  fi
  ln -sfn "$dir/$name" "$current/$name"
}

kube_version="$(cd "$here/kubernetes" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
if (( ${#extras[@]} )); then
  # Same pin or nothing: a controller-manager from another release than the
  # apiserver it talks to would test a skew nobody asked for.
  ctl_version="$(cd "$here/kubernetes-controllers" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
  if [[ "$ctl_version" != "$kube_version" ]]; then
    echo "build.sh: kubernetes-controllers pins k8s.io/kubernetes $ctl_version but kubernetes pins $kube_version" >&2
    exit 1
  fi
fi
kube_major="${kube_version#v}"; kube_major="${kube_major%%.*}"
kube_minor="${kube_version#v*.}"; kube_minor="${kube_minor%%.*}"
kube_stamp=()
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_stamp+=("$pkg.gitVersion=$kube_version" "$pkg.gitMajor=$kube_major"
               "$pkg.gitMinor=$kube_minor" "$pkg.gitTreeState=clean"
               "$pkg.buildDate=1970-01-01T00:00:00Z")
done

build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes "${kube_stamp[@]}"
build kubernetes kubectl k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes "${kube_stamp[@]}"
build etcd etcd go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
if $with_helm; then
  helm_version="$(cd "$here/helm" && go list -m -f '{{.Version}}' helm.sh/helm/v4)"
  build helm helm helm.sh/helm/v4/cmd/helm helm.sh/helm/v4 \
    "helm.sh/helm/v4/internal/version.version=$helm_version"
fi

if (( ${#extras[@]} )); then
  for name in "${extras[@]}"; do
    build kubernetes-controllers "$name" "k8s.io/kubernetes/cmd/$name" k8s.io/kubernetes "${kube_stamp[@]}"
  done
fi

echo "$current"
