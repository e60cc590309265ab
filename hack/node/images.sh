#!/usr/bin/env bash
# Build the node's images without a Docker engine or a registry, as OCI image
# archives in $HEADROOM_CACHE/images/<name>-<hash>.tar (outside git), ready for
# `ctr -n k8s.io images import`:
#   localhost/headroom/pause:1     the pod sandbox (pause.c, static)
#   localhost/headroom/busybox:1   a workload image (Debian's busybox-static)
#   localhost/headroom/kubectl:1   busybox + the project's kubectl (only when asked:
#                                  `images.sh kubectl`; default is pause and busybox)
# Needs: gcc with a static libc (libc6-dev), umoci, busybox-static, python3.
# Prints the archive paths. A cached archive is reused while its inputs match.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${HEADROOM_CACHE:-$HOME/.cache/headroom}/images"
mkdir -p "$cache"

for tool in gcc umoci python3; do
  command -v "$tool" >/dev/null || { echo "images.sh: '$tool' is not on PATH (apt-get install gcc umoci)" >&2; exit 1; }
done
[[ -x /bin/busybox ]] || { echo "images.sh: /bin/busybox missing (apt-get install busybox-static)" >&2; exit 1; }

# pack NAME REF ROOTFS_FILLER ENTRYPOINT_JSON CMD_JSON USER
# ROOTFS_FILLER is a function called with the rootfs directory.
pack() {
  local name="$1" ref="$2" filler="$3" entrypoint="$4" cmd="$5" user="$6" key="$7"
  local hash out work
  hash="$( { cat "${BASH_SOURCE[0]}"; echo "$key"; } | sha256sum | cut -c1-8)"
  out="$cache/$name-$hash.tar"
  if [[ ! -s "$out" ]]; then
    local start=$SECONDS
    rm -f "$cache/$name-"*.tar  # an older build of the same image
    work="$(mktemp -d)"
    umoci init --layout "$work/oci"
    umoci new --image "$work/oci:img"
    umoci unpack --image "$work/oci:img" "$work/bundle" >/dev/null
    "$filler" "$work/bundle/rootfs"
    umoci repack --image "$work/oci:img" "$work/bundle"
    local args=(--image "$work/oci:img" --config.user "$user" --config.workingdir /)
    [[ -n "$entrypoint" ]] && args+=(--config.entrypoint "$entrypoint")
    [[ -n "$cmd" ]] && args+=(--config.cmd "$cmd")
    umoci config "${args[@]}"
    umoci gc --layout "$work/oci"
    # Name the image the way containerd's importer reads it.
    python3 - "$work/oci/index.json" "$ref" <<'PY'
import json, sys
path, ref = sys.argv[1], sys.argv[2]
index = json.load(open(path))
for m in index["manifests"]:
    m.setdefault("annotations", {})["io.containerd.image.name"] = ref
json.dump(index, open(path, "w"))
PY
    tar -C "$work/oci" -cf "$out.tmp" . && mv "$out.tmp" "$out"
    rm -rf "$work"
    echo "built image $ref in $((SECONDS - start))s: $(du -h "$out" | cut -f1) ($out)" >&2
  fi
  echo "$out"
}

fill_pause() {
  gcc -static -Os -s -o "$1/pause" "$here/pause.c"
}

fill_busybox() {
  mkdir -p "$1/bin" "$1/tmp" "$1/etc"
  cp /bin/busybox "$1/bin/busybox"
  chroot "$1" /bin/busybox --install -s /bin
  echo 'root:x:0:0:root:/root:/bin/sh' > "$1/etc/passwd"
  echo 'root:x:0:' > "$1/etc/group"
}

kubectl_bin="$cache/../bin/current/kubectl"
fill_kubectl() {  # busybox + the project's own kubectl build: an in-cluster client for tests
  fill_busybox "$1"
  cp -L "$kubectl_bin" "$1/bin/kubectl"
}

for image in "${@:-pause busybox}"; do
  for image in $image; do
    case "$image" in
      pause) pack pause localhost/headroom/pause:1 fill_pause /pause "" 65535:65535 \
               "$(cat "$here/pause.c"; gcc --version | head -1)" ;;
      busybox) pack busybox localhost/headroom/busybox:1 fill_busybox "" /bin/sh 0:0 \
                 "busybox-static $(dpkg-query -W -f '${Version}' busybox-static)" ;;
      kubectl) [[ -x "$kubectl_bin" ]] || { echo "images.sh: no kubectl at $kubectl_bin: make controlplane" >&2; exit 1; }
               pack kubectl localhost/headroom/kubectl:1 fill_kubectl "" /bin/sh 0:0 \
                 "busybox-static $(dpkg-query -W -f '${Version}' busybox-static) $(sha256sum < "$kubectl_bin")" ;;
      *) echo "images.sh: unknown image '$image' (pause, busybox, kubectl)" >&2; exit 1 ;;
    esac
  done
done
