#!/usr/bin/env bash
# Put Debian's prometheus and promtool (the real ones the alert tests run) into
# the cache outside git, without installing the package or starting a service:
# `apt-get download` + `dpkg -x` into $HEADROOM_CACHE/prometheus/<version>/, then
# $HEADROOM_BIN_DIR/{prometheus,promtool} link them. apt is the one source (no
# binary downloads). Reused while the links work; fails loudly; prints nothing
# when both are there.
set -euo pipefail

cache="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
current="${HEADROOM_BIN_DIR:-$cache/bin/current}"

[[ -x "$current/prometheus" && -x "$current/promtool" ]] && exit 0

for tool in apt-get apt-cache dpkg; do
  command -v "$tool" >/dev/null || { echo "hack/prometheus.sh: '$tool' not found; Debian's apt is where prometheus comes from" >&2; exit 1; }
done

candidate() { apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}'; }
version="$(candidate)"
if [[ -z "$version" || "$version" == "(none)" ]]; then
  [[ $EUID -eq 0 ]] || { echo "hack/prometheus.sh: apt knows no 'prometheus' package; run 'sudo apt-get update' first" >&2; exit 1; }
  apt-get update -qq
  version="$(candidate)"
  [[ -n "$version" && "$version" != "(none)" ]] || { echo "hack/prometheus.sh: apt has no 'prometheus' package after apt-get update" >&2; exit 1; }
fi

dir="$cache/prometheus/$version"
if [[ ! -x "$dir/usr/bin/prometheus" || ! -x "$dir/usr/bin/promtool" ]]; then
  echo "fetching Debian's prometheus $version (apt-get download, about 19 MB) ..." >&2
  work="$(mktemp -d)"
  if [[ $EUID -eq 0 ]] && id _apt >/dev/null 2>&1; then chown _apt "$work"; fi  # apt's sandbox user writes there
  trap 'rm -rf "$work"' EXIT
  if ! (cd "$work" && apt-get download -qq "prometheus=$version"); then
    # Lists older than the mirror name a version it no longer has: refresh them, once.
    [[ $EUID -eq 0 ]] || { echo "hack/prometheus.sh: apt-get download prometheus=$version failed; try 'sudo apt-get update'" >&2; exit 1; }
    apt-get update -qq
    version="$(candidate)" dir="$cache/prometheus/$(candidate)"
    (cd "$work" && apt-get download -qq "prometheus=$version")
  fi
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  dpkg -x "$work"/prometheus_*.deb "$dir.tmp"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
mkdir -p "$current"
ln -sfn "$dir/usr/bin/prometheus" "$current/prometheus"
ln -sfn "$dir/usr/bin/promtool" "$current/promtool"
"$current/promtool" --version >/dev/null
"$current/prometheus" --version >/dev/null
