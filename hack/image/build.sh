#!/usr/bin/env bash
# Build the operator's OCI image without a Docker engine or a registry.
#
# The Dockerfile itself is the recipe: hack/image/dockerfile.py runs each of its
# stages in a Debian bookworm root made by mmdebstrap (standing in for
# python:3.11-slim: python3, pip, `python` -> python3, no EXTERNALLY-MANAGED
# marker), and the final stage's ENV, USER, EXPOSE, WORKDIR and ENTRYPOINT become
# the image config. umoci packs the final root as one layer, named
#   ghcr.io/headroom-dev/headroom:<appVersion of charts/headroom/Chart.yaml>
# (the chart's default image) for `ctr -n k8s.io images import`.
#
# Writes $HEADROOM_CACHE/images/headroom-<hash>.tar (an OCI layout archive), reused
# while every input hashes the same; prints its path on stdout, progress on stderr.
# Needs root, mmdebstrap, umoci, python3 and the network (Debian mirror, PyPI).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
images="$cache/images"
packages=(python3 python3-pip python-is-python3)
sources=/etc/apt/sources.list.d/debian.sources  # the host's apt sources

die() { echo "build.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null || die "'$1' is not on PATH (apt-get install -y $2)"; }
need mmdebstrap mmdebstrap
need umoci umoci
need python3 python3
need chroot coreutils
need findmnt util-linux
need apt-cache apt
[[ $EUID -eq 0 ]] || die "must run as root (mmdebstrap's root mode, chroot)"
[[ -f $sources ]] || sources=/etc/apt/sources.list
[[ -f $sources ]] || die "no host apt sources at /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"

dockerfile="$repo/Dockerfile"
helper="$here/dockerfile.py"
version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$repo/charts/headroom/Chart.yaml")"
[[ -n $version ]] || die "no appVersion in charts/headroom/Chart.yaml"
ref="ghcr.io/headroom-dev/headroom:$version"

# Every input: this recipe, the Dockerfile and the build context it COPYs (minus
# .dockerignore's), the Debian sources and the candidate versions of the packages.
hash="$(
  cd "$repo"
  {
    sha256sum hack/image/build.sh hack/image/dockerfile.py hack/image/install.sh \
      Dockerfile .dockerignore pyproject.toml README.md charts/headroom/Chart.yaml "$sources"
    python3 "$helper" inputs Dockerfile . | tr '\n' '\0' | xargs -0 sha256sum
    mmdebstrap --version
    apt-cache policy "${packages[@]}" python3.11 | grep -E '^[^ ]|Candidate'
  } | sha256sum | cut -c1-12
)"
out="$images/headroom-$hash.tar"
# Beside it, the wheels the build stage made (the image has exactly these installed):
# versions resolve at build time, so this is what a test compares the image against.
record="$images/headroom-$hash.wheels"
if [[ -s $out && -s $record ]]; then
  echo "$out"
  exit 0
fi

start=$SECONDS
mkdir -p "$images"
work="$(mktemp -d /tmp/headroom-image.XXXXXX)"
cleanup() {
  trap '' INT TERM  # a second Ctrl-C (or a script's SIGTERM after its SIGINT) must not cut this short
  # Never delete through a mount that mmdebstrap or a chroot left behind.
  if findmnt -rn -o TARGET | grep -q "^$work"; then
    echo "build.sh: mounts remain under $work; not removing it" >&2
  else
    rm -rf "$work"
  fi
  rm -f "$out.tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # so that cleanup runs on a signal too

umoci init --layout "$work/oci"
umoci new --image "$work/oci:$version"
umoci unpack --image "$work/oci:$version" "$work/bundle" >/dev/null
mkdir -p "$work/exports"

common=(
  --variant=minbase --include="$(IFS=,; echo "${packages[*]}")"
  # Merged /usr by symlinks, as Debian's images: the usrmerge package would pull in perl (47 MB).
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  # As debian:bookworm-slim (python:3.11-slim's base): no docs, man pages or locales.
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --dpkgopt='path-exclude=/usr/share/groff/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
)

mapfile -t stages < <(python3 "$helper" stages "$dockerfile")
last=$(( ${#stages[@]} - 1 ))
for entry in "${stages[@]}"; do
  index="${entry%% *}"
  if (( index == last )); then target="$work/bundle/rootfs"; else target=/dev/null; fi
  echo "build.sh: stage ${entry#* } (mmdebstrap bookworm, then the Dockerfile's steps)" >&2
  stage_start=$SECONDS
  mmdebstrap --quiet "${common[@]}" \
    --customize-hook="python3 $helper run-stage $dockerfile $index \"\$1\" $repo $work/exports" \
    bookworm "$target" "$sources" >&2
  echo "build.sh: stage ${entry#* } took $((SECONDS - stage_start))s" >&2
done

find "$work/exports" -name '*.whl' -printf '%f\n' | LC_ALL=C sort > "$work/wheels"
[[ -s "$work/wheels" ]] || die "the build stage made no wheels"

rootfs="$work/bundle/rootfs"
# The runtime supplies /dev, resolv.conf and hostname; the image carries none.
find "$rootfs/dev" -mindepth 1 -delete
rm -f "$rootfs/etc/resolv.conf" "$rootfs/etc/hostname"
rootfs_size="$(du -sh --apparent-size "$rootfs" | cut -f1)"

pack_start=$SECONDS
umoci repack --image "$work/oci:$version" "$work/bundle"
mapfile -d '' -t config < <(python3 "$helper" config "$dockerfile")
umoci config --image "$work/oci:$version" --history.created_by "hack/image/build.sh (Dockerfile)" "${config[@]}"
umoci gc --layout "$work/oci"
python3 "$helper" annotate "$work/oci/index.json" "$ref"

echo "build.sh: packing took $((SECONDS - pack_start))s" >&2
rm -f "$images"/headroom-*.tar "$images"/headroom-*.wheels  # older builds
mv "$work/wheels" "$record"
tar -C "$work/oci" -cf "$out.tmp" . && mv "$out.tmp" "$out"
echo "build.sh: built $ref in $((SECONDS - start))s: archive $(du -h "$out" | cut -f1), rootfs $rootfs_size ($out)" >&2
echo "$out"
