#!/usr/bin/env bash
# Install the Debian packages a real node and the image build need, if missing:
# containerd + runc + CNI plugins (the node), iptables (the ClusterIP rule),
# busybox-static + gcc/libc6-dev + umoci (the small images), mmdebstrap (the
# operator's root filesystem), curl (health checks). Root only; apt is the one
# source (no binary downloads). Fails loudly; prints nothing when all are there.
set -euo pipefail

packages=(containerd runc containernetworking-plugins iptables busybox-static gcc libc6-dev umoci mmdebstrap curl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
[[ $EUID -eq 0 ]] || { echo "hack/node/deps.sh: missing Debian packages (${missing[*]}); run as root or: sudo apt-get install ${missing[*]}" >&2; exit 1; }
echo "installing ${missing[*]} ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
