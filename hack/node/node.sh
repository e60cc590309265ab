#!/usr/bin/env bash
# One real node on this machine: containerd (Debian's 1.6) + runc + CNI bridge
# + the kubelet built by hack/node/build.sh, against an API server you give it.
#
#   hack/node/node.sh up KUBECONFIG [NODE_NAME]   start containerd and the kubelet
#   hack/node/node.sh down                         stop everything, clean up, idempotent
#   hack/node/node.sh status
#
# The kubeconfig must authenticate as system:node:NODE_NAME in group system:nodes
# (or as an admin); see docs/development/real-node.md for the RBAC it needs.
# NODE_NAME defaults to this machine's hostname: the API server reaches the
# kubelet (logs, exec) by the Node's Hostname address, and the hostname resolves
# to 127.0.0.1 here, where the kubelet listens. HEADROOM_NODE_CLIENT_CA names the
# CA whose client certificates the kubelet accepts (the API server's
# --kubelet-client-certificate); without it every logs/exec call gets 401.
# Everything lives under $HEADROOM_NODE_ROOT (default /var/lib/headroom-node) and
# $HEADROOM_NODE_RUN (default /run/headroom-node); the few paths containerd 1.6
# and the kubelet hard-code elsewhere are listed in the doc and cleaned by `down`.
# Knobs: HEADROOM_NODE_KUBELET (kubelet binary; default the one build.sh linked),
# HEADROOM_NODE_RUNC (runc binary containerd runs, e.g. a logging wrapper),
# HEADROOM_NODE_KUBELET_V (kubelet log verbosity), HEADROOM_NODE_POD_CIDR,
# HEADROOM_NODE_KUBELET_PORT, HEADROOM_NODE_HEALTHZ_PORT.
# HEADROOM_NODE_APISERVER_PORT: if set, pods reach the API server (which listens
# on 127.0.0.1:PORT) at the `kubernetes` Service's ClusterIP
# ($HEADROOM_NODE_SERVICE_IP, default 10.0.0.1) port 443, as in-cluster clients
# expect: one DNAT rule in its own nat chain plus route_localnet on the bridge,
# the part of kube-proxy this needs. The API server's serving certificate must
# name that IP.
# One node per machine: the bridge (hr0), the CRI's netns names (/run/netns/cni-*)
# and containerd 1.6's /run/containerd/{s,fifo,runc} are machine-wide.
# Needs root. Fails loudly: any step that does not work exits non-zero with the
# tail of the log that says why.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${HEADROOM_CACHE:-$HOME/.cache/headroom}"
root="${HEADROOM_NODE_ROOT:-/var/lib/headroom-node}"
run="${HEADROOM_NODE_RUN:-/run/headroom-node}"
sock="$run/containerd.sock"
bridge=hr0
pod_cidr="${HEADROOM_NODE_POD_CIDR:-10.244.0.0/24}"
kubelet_port="${HEADROOM_NODE_KUBELET_PORT:-10250}"
healthz_port="${HEADROOM_NODE_HEALTHZ_PORT:-10248}"

service_ip="${HEADROOM_NODE_SERVICE_IP:-10.0.0.1}"
chain=HEADROOM-NODE

die() { echo "node.sh: $*" >&2; exit 1; }
ctr_() { ctr --address "$sock" -n k8s.io "$@"; }
alive() { [[ -f "$run/$1.pid" ]] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

# wait_for NAME SECONDS COMMAND...: poll until COMMAND succeeds, or die with NAME's log.
wait_for() {
  local name="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    alive "$name" || { tail -n 40 "$root/log/$name.log" >&2; die "$name exited while starting (log: $root/log/$name.log)"; }
    ((SECONDS < deadline)) || { tail -n 40 "$root/log/$name.log" >&2; die "$name not ready after ${secs}s (log: $root/log/$name.log)"; }
    sleep 0.2
  done
}

# started NAME SECONDS COMMAND...: like wait_for, but returns 1 if NAME exited first.
started() {
  local name="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    alive "$name" || return 1
    ((SECONDS < deadline)) || { tail -n 40 "$root/log/$name.log" >&2; die "$name not ready after ${secs}s (log: $root/log/$name.log)"; }
    sleep 0.2
  done
}

start_bg() {  # NAME ARGV...: start detached (own session), pid in $run/NAME.pid
  local name="$1"; shift
  setsid "$@" >>"$root/log/$name.log" 2>&1 < /dev/null &
  echo $! > "$run/$name.pid"
}

stop_pid() {  # NAME: SIGTERM, then SIGKILL after 10 s
  local name="$1" pid
  [[ -f "$run/$name.pid" ]] || return 0
  pid="$(cat "$run/$name.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && { echo "node.sh: $name ($pid) ignored SIGTERM, killing" >&2; kill -KILL "$pid"; }
  fi
  rm -f "$run/$name.pid"
}

stop_stray() {  # NAME PATTERN: one whose pid file was never written (its driver was
  # stopped between starting it and the echo): found by its command line, then stopped.
  local name="$1" pid
  for pid in $(pgrep -f -- "$2" || true); do
    mkdir -p "$run" && echo "$pid" > "$run/$name.pid"
    stop_pid "$name"
  done
}

write_configs() {
  mkdir -p "$root"/{containerd,kubelet,log,pod-logs,cni/net.d,cni/networks} "$run"
  cat > "$root/containerd.toml" <<TOML
version = 2
root = "$root/containerd"
state = "$run/containerd"
[grpc]
  address = "$sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$root/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/headroom/pause:1"
  # Root here lacks CAP_SYS_RESOURCE (CapEff 000001fffeffffff): runc cannot set the
  # negative oom_score_adj the kubelet asks for (-998 for a sandbox) and fails with
  # "can't get final child's PID from pipe: EOF". Clamp to containerd's own (0).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "${HEADROOM_NODE_RUNC:-runc}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$root/cni/net.d"
TOML
  cat > "$root/cni/net.d/10-headroom.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "headroom",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$root/cni/networks",
        "ranges": [[{"subnet": "$pod_cidr"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
JSON
  cat > "$root/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$sock
failSwapOn: false
oomScoreAdj: 0  # no CAP_SYS_RESOURCE here; the default -999 fails (logged, ignored)
address: 127.0.0.1
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "${HEADROOM_NODE_CLIENT_CA:-}"}
authorization:
  mode: AlwaysAllow
podLogsDir: $root/pod-logs
podCIDR: $pod_cidr
resolvConf: /etc/resolv.conf
registerNode: true
serializeImagePulls: false
YAML
}

up() {
  local kubeconfig="${1:?usage: node.sh up KUBECONFIG [NODE_NAME]}" name="${2:-$(hostname)}"
  [[ $EUID -eq 0 ]] || die "must run as root"
  [[ -r "$kubeconfig" ]] || die "no kubeconfig at $kubeconfig"
  local kubelet="${HEADROOM_NODE_KUBELET:-$cache/bin/current/kubelet}" t
  [[ -x "$kubelet" ]] || die "no kubelet at $kubelet: run hack/node/build.sh"
  for t in containerd containerd-shim-runc-v2 runc ctr; do
    command -v "$t" >/dev/null || die "'$t' not on PATH: apt-get install containerd runc"
  done
  [[ -x /usr/lib/cni/bridge ]] || die "no CNI plugins in /usr/lib/cni: apt-get install containernetworking-plugins"
  alive kubelet && die "a kubelet is already running (pid $(cat "$run/kubelet.pid")): node.sh down first"
  local images; images="$(bash "$here/images.sh")"

  # Whatever an earlier run left (a crash, a kill -9 of its driver): clean it first.
  down >/dev/null
  write_configs
  local n; for n in containerd kubelet; do  # keep the previous run's logs, once
    [[ -f "$root/log/$n.log" ]] && mv -f "$root/log/$n.log" "$root/log/$n.log.1"
  done
  start_bg containerd containerd --config "$root/containerd.toml"
  wait_for containerd 30 ctr --address "$sock" version
  local img; for img in $images; do ctr_ images import "$img" >/dev/null; done
  [[ "$(ctr_ images ls -q)" == *localhost/headroom/pause:1* ]] || die "pause image missing after import"

  if [[ -n "${HEADROOM_NODE_APISERVER_PORT:-}" ]]; then
    # The bridge exists before the first pod so that route_localnet can be set on it;
    # the CNI bridge plugin adopts it (same name, gateway address already there).
    local gw="${pod_cidr%.*}.1" bits="${pod_cidr#*/}"
    ip link add "$bridge" type bridge
    ip addr add "$gw/$bits" dev "$bridge"
    ip link set "$bridge" up
    sysctl -qw "net.ipv4.conf.$bridge.route_localnet=1"
    iptables -t nat -N "$chain"
    iptables -t nat -A "$chain" -d "$service_ip/32" -p tcp --dport 443 \
      -j DNAT --to-destination "127.0.0.1:$HEADROOM_NODE_APISERVER_PORT"
    iptables -t nat -A PREROUTING -i "$bridge" -j "$chain"
  fi

  # kubelet v1.35.4 sometimes dies at start-up with "fatal error: concurrent map
  # iteration and map write" (cm.GetCapacity, container_manager_linux.go:957, racing
  # the DRA plugin manager's first read of the Node): an upstream race, seen once in
  # a CI run. Started again, it comes up; a third failure is a real one.
  local attempt logged
  for attempt in 1 2 3; do
    logged=$(stat -c %s "$root/log/kubelet.log" 2>/dev/null || echo 0)
    start_bg kubelet "$kubelet" \
      --config="$root/kubelet.yaml" \
      --kubeconfig="$kubeconfig" \
      --root-dir="$root/kubelet" \
      --cert-dir="$root/kubelet/pki" \
      --hostname-override="$name" \
      --v="${HEADROOM_NODE_KUBELET_V:-1}"
    if started kubelet 60 curl -sf "http://127.0.0.1:$healthz_port/healthz"; then
      break
    fi
    if ((attempt == 3)) || ! tail -c +"$((logged + 1))" "$root/log/kubelet.log" |
        grep -q "concurrent map iteration and map write"; then
      tail -n 40 "$root/log/kubelet.log" >&2
      die "kubelet exited while starting (log: $root/log/kubelet.log)"
    fi
    echo "node.sh: kubelet hit the upstream start-up race (attempt $attempt); starting it again" >&2
  done
  echo "node $name: kubelet pid $(cat "$run/kubelet.pid"), containerd pid $(cat "$run/containerd.pid"), logs in $root/log"
}

down() {
  [[ $EUID -eq 0 ]] || die "must run as root"
  local started=$SECONDS
  stop_pid kubelet
  stop_stray kubelet "--config=$root/kubelet.yaml"
  # Whatever containers are left: kill and delete them through containerd (no CNI DEL:
  # their network namespaces and IPs are removed below by hand).
  if [[ -S "$sock" ]] && ctr --address "$sock" version >/dev/null 2>&1; then
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$id" 2>/dev/null || true; done
    for id in $(ctr_ tasks ls -q 2>/dev/null); do
      for _ in $(seq 25); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 && break; sleep 0.2; done
    done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd
  stop_stray containerd "containerd --config $root/containerd.toml"
  # Shims outlive containerd by design; ours are the ones whose -address is our socket.
  local pid
  for pid in $(pgrep -f -- "containerd-shim-runc-v2 .*-address $sock" || true); do kill -KILL "$pid" 2>/dev/null || true; done
  # Mounts under our trees (rootfs overlays, sandbox shm, kubelet volumes), deepest first.
  local m
  while read -r m; do umount -l "$m" 2>/dev/null || true; done < <(
    awk -v a="$root" -v b="$run" '$5 ~ "^"a"/" || $5 ~ "^"b"/" {print $5}' /proc/self/mountinfo | sort -r)
  # Network namespaces made by the CRI plugin (named cni-<uuid>; nothing else on this machine makes them).
  local ns
  for ns in /run/netns/cni-*; do
    [[ -e "$ns" ]] || continue
    umount -l "$ns" 2>/dev/null || true; rm -f "$ns"
  done
  ip link show "$bridge" >/dev/null 2>&1 && ip link delete "$bridge"
  if iptables -t nat -S "$chain" >/dev/null 2>&1; then
    while iptables -t nat -D PREROUTING -i "$bridge" -j "$chain" 2>/dev/null; do :; done
    iptables -t nat -F "$chain" && iptables -t nat -X "$chain"
  fi
  rm -rf "$root/cni/networks"
  # The kubelet's cgroups (cgroupfs driver): remove leaves first, in every hierarchy.
  local c
  for c in /sys/fs/cgroup/*/kubepods; do
    [[ -d "$c" ]] || continue
    find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  # Paths containerd 1.6 and the kubelet hard-code outside our trees.
  local f
  for f in /var/log/containers/*.log; do  # the kubelet's symlinks into our pod-logs
    [[ -L "$f" && "$(readlink "$f")" == "$root/"* ]] && rm -f "$f"
  done
  rm -f /var/lib/cni/results/headroom-* /var/lib/cni/results/cni-loopback-*  # go-cni's result cache
  if ! pgrep -x containerd >/dev/null; then  # shim sockets, fifos, runc state: empty dirs by now
    [[ -d /run/containerd ]] && find /run/containerd -depth -type d -empty -delete
  fi
  rm -rf "$run"
  echo "node down in $((SECONDS - started))s"
}

status() {
  local n
  for n in containerd kubelet; do
    if alive "$n"; then echo "$n: running (pid $(cat "$run/$n.pid"))"; else echo "$n: stopped"; fi
  done
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  status) status ;;
  *) die "usage: node.sh up KUBECONFIG [NODE_NAME] | down | status" ;;
esac
