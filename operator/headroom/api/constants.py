"""Names, bounds and defaults: each figure's one definition.

Every bound here is used by the CRD schema (so ``kubectl apply`` refuses what
is out of range), by the config model, by the parsers of Node annotations and
labels, and by the NodeHeadroom summary. Keeping them in one place is what
makes "one bound per figure" true: no value can pass one check and overflow
another.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from fractions import Fraction

# -- API identity -------------------------------------------------------------------------

GROUP = "headroom.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: Annotation that carries an owner's heartbeat (RFC 3339), on a Reservation or its pod.
HEARTBEAT_ANNOTATION = f"{GROUP}/heartbeat"
#: Label that makes a pod an owner the operator watches.
OWNER_LABEL = f"{GROUP}/owner"
#: A pod opts in to gating with this label (``"true"``): the webhook's objectSelector.
CLAIM_LABEL = f"{GROUP}/claim"
#: ``strict`` on a Reservation (annotation) or its Namespace (label): a create the
#: ledger would reject now is refused at create, and one it would admit holds its room
#: until it is decided (the outlook at create, issue 32).
OUTLOOK_MODE = f"{GROUP}/outlook"
STRICT = "strict"
#: On the leader's Lease: the URL of its webhook, where a standby forwards the reviews
#: only the leader can answer (a Reservation's outlook).
WEBHOOK_URL_ANNOTATION = f"{GROUP}/webhook-url"
#: What a gated pod claims, as pod annotations (quantities, or plain MiB).
RAM_ANNOTATION = f"{GROUP}/ram"
VRAM_ANNOTATION = f"{GROUP}/vram"
#: How long a gated pod may wait for room (a Go duration); and a fixed node.
WAIT_ANNOTATION = f"{GROUP}/wait"
NODE_ANNOTATION = f"{GROUP}/node"
#: Over how many GPU devices a gated pod's VRAM is spread (spec.gpus).
GPUS_ANNOTATION = f"{GROUP}/gpus"
#: The name of the Reservation that holds a gated pod's memory, set when it is ungated.
RESERVATION_ANNOTATION = f"{GROUP}/reservation"
#: The GPU devices a gated pod's VRAM was admitted on (comma-separated ids), set with it.
DEVICES_ANNOTATION = f"{GROUP}/devices"
#: Written on a pod whose admission for kube-scheduler's choice waited too long for its
#: Binding, before its reservation is released: the write makes a late Binding fail.
FENCE_ANNOTATION = f"{GROUP}/bind-fence"
#: Written on a pod kube-scheduler left unschedulable for want of ledger room, when room
#: comes back: the update makes the scheduler try it again at once.
ROOM_ANNOTATION = f"{GROUP}/room"
#: The scheduling gate a claiming pod is created behind, removed when it is admitted.
SCHEDULING_GATE = f"{GROUP}/admission"
#: Per-node overrides of the limits, as Node annotations.
RATIO_ANNOTATION = f"{GROUP}/max-overcommit-ratio"
RESERVE_ANNOTATION = f"{GROUP}/system-reserve-mb"
ENTRIES_ANNOTATION = f"{GROUP}/max-entries"
VRAM_RATIO_ANNOTATION = f"{GROUP}/max-vram-overcommit-ratio"
GPU_POLICY_ANNOTATION = f"{GROUP}/gpu-policy"
#: GPU Feature Discovery labels: MiB per GPU, and the number of GPUs.
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
#: More GFD labels: time-slicing replicas per GPU (0 on a MIG-enabled GPU), the
#: product name (``…-MIG-<profile>`` under MIG ``single``), the MIG strategy, and
#: under ``mixed`` one ``nvidia.com/mig-<profile>.count`` / ``.memory`` pair per profile.
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_LABEL_PREFIX = "nvidia.com/mig-"
#: HAMi's device plugin registers each node's GPUs in this annotation.
HAMI_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
#: The DRA drivers whose ResourceSlices are read as GPU inventory, by default.
DEFAULT_DRA_DRIVERS = ("gpu.nvidia.com",)
#: Extended resources by which device plugins give pods whole GPUs.
DEFAULT_DEVICE_PLUGIN_RESOURCES = ("nvidia.com/gpu",)

# -- bounds ---------------------------------------------------------------------------------

#: 1 PiB in MiB: one reservation, one node's RAM or VRAM, a system reserve. Larger
#: than any machine; small enough that sums of these never approach int64.
MAX_MB = 1 << 30
#: Active reservations on one node (the cap itself is configurable up to this).
MAX_ENTRIES_PER_NODE = 100_000
#: Overcommit ratio: 0 (unlimited) to 100, with at most this many decimal places.
MAX_RATIO = Fraction(100)
MAX_RATIO_DECIMALS = 9
#: A sum over one node's reservations (reserved RAM and VRAM, the limit
#: ``total × ratio``) can never exceed this, whatever the entries are.
MAX_NODE_SUM_MB = MAX_MB * MAX_ENTRIES_PER_NODE
#: GPUs on one node; also GPU devices (full GPUs and MIG devices) in its inventory.
MAX_GPUS = 1024
#: Time-slicing replicas of one GPU (GFD's ``nvidia.com/gpu.replicas``).
MAX_GPU_REPLICAS = 1_000_000
#: Devices in one ResourceSlice (``resource.k8s.io/v1`` allows at most 128).
MAX_DEVICES_PER_SLICE = 128
#: ResourceSlices read for one node (all pools of the configured drivers).
MAX_SLICES_PER_NODE = 64
#: The longest inventory text read: a HAMi annotation (all of a Node's annotations
#: together may be 256 KiB).
MAX_INVENTORY_TEXT = 256 * 1024
#: The longest device identity, pool or driver name read (a DNS subdomain).
MAX_DEVICE_NAME = 253
#: DRA drivers configured as GPU inventory sources.
MAX_DRA_DRIVERS = 16
#: Times a tenant can write (expiresAt, heartbeats). The upper bound leaves room to
#: add any duration below without leaving what a datetime can hold.
MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9000, 1, 1, tzinfo=UTC)
#: Any configured duration.
MAX_DURATION = timedelta(days=366)
#: The longest a reservation may wait for room (``spec.wait``).
MAX_WAIT = timedelta(hours=24)
#: A Go duration, as ``spec.wait`` is written (``90s``, ``5m``, ``1h30m``).
GO_DURATION = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$"
#: The longest number, time or duration text any parser reads.
MAX_VALUE_LENGTH = 64
#: The longest lifetime a HeadroomQuota may allow or give (spec.maxLifetime, defaultLifetime).
MAX_LIFETIME = timedelta(days=3660)
#: A HeadroomQuota's RAM or VRAM: a million of the largest nodes.
MAX_QUOTA_MB = MAX_MB * 1_000_000
#: A HeadroomQuota's cap on Admitted entries.
MAX_QUOTA_ENTRIES = 100_000_000
#: A label selector's size (matchLabels entries, matchExpressions, values per expression).
MAX_SELECTOR_TERMS = 64
#: Linux's PID_MAX_LIMIT.
MAX_PID = 4_194_304

# -- defaults -------------------------------------------------------------------------------

DEFAULT_MAX_OVERCOMMIT_RATIO = Fraction(1)
#: Per GPU device (and for a node's VRAM sum): no overcommit.
DEFAULT_VRAM_OVERCOMMIT_RATIO = Fraction(1)
DEFAULT_SYSTEM_RESERVE_MB = 1024
DEFAULT_HEARTBEAT_STALE_WINDOW = timedelta(minutes=5)
DEFAULT_MAX_ENTRIES_PER_NODE = 110  # the kubelet's default max pods per node
