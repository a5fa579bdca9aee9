#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One simulated GPU node of `make cluster`, run by scripts/cluster/up.sh as PID 1 of the node's
# own PID, mount and UTS namespaces, inside the node's network namespace. It makes the host
# look like a GPU node to everything started in it, then runs the container engine (containerd 2,
# or CRI-O with RUNTIME=crio) and kubelet, each under a restart loop: the node's service manager,
# with a `systemctl restart UNIT` of its own (the installer restarts containerd by signal and
# CRI-O through systemctl, as on a real node). It runs until it is killed; then the kernel ends
# every process of the node and drops its mounts. Nothing is written outside NODE_DIR:
#   /etc, /usr/local, /usr/share, /opt, /var/lib   overlays on the host's (upper layers in
#                                      NODE_DIR), so
#                                      the installer's edits land in the node only
#   /var/lib/containerd, /var/lib/containers, /var/lib/kubelet, /var/log   the node's own
#                                      directories (containerd's, CRI-O's image store)
#   /run                               a tmpfs
#   /dev                               a tmpfs with the host's basic nodes and the simulated
#                                      GPUs' /dev/nvidia* (the mock NVML looks at /dev)
#   /proc/driver                       a tmpfs holding the simulated /proc/driver/nvidia
#   /run/nvidia/driver                 the simulated driver root, with /dev in it, as a driver
#                                      container's root is
# Environment: NODE (name), NODE_DIR, SIM (the nvshim-simnode directory), PEERS (binaries),
# NODE_IP, RUNTIME (containerd or crio).
set -euo pipefail
: "${NODE:?}" "${NODE_DIR:?}" "${SIM:?}" "${PEERS:?}" "${NODE_IP:?}"
runtime=${RUNTIME:-containerd}

hostname "$NODE"
mount --make-rprivate /
# `ip netns exec` mounted a sysfs of the node's network namespace over /sys, which hides the
# host's cgroup mounts: mount the same hierarchies again (the host's, read before /proc is
# this PID namespace's).
cgroups=$(awk '$3 == "cgroup" || $3 == "cgroup2" {print $3, $2, $4}' /proc/1/mounts)
mount -t proc proc /proc
if ! mountpoint -q /sys/fs/cgroup; then
  while read -r type path opts; do
    if [ "$path" = /sys/fs/cgroup ]; then
      mount -t "$type" -o "$opts" "$type" /sys/fs/cgroup
    else
      mountpoint -q /sys/fs/cgroup || mount -t tmpfs -o mode=755 cgroup-root /sys/fs/cgroup
      mkdir -p "$path"
      mount -t "$type" -o "$opts" "$type" "$path"
    fi
  done <<< "$cgroups"
fi

# This host's hugetlb controller is on cgroup v2 while the others are v1 (hybrid), so runc
# cannot apply a hugetlb limit, and kubelet asks one for every hugepage size the node has
# (CRI-O passes them on; containerd drops them, disable_hugetlb_controller): the node shows no
# hugepage sizes. Nothing here uses huge pages.
if [ -d /sys/kernel/mm/hugepages ] && ! awk '$2 == "/sys/fs/cgroup/hugetlb"' /proc/self/mounts | grep -q .; then
  mount -t tmpfs -o ro,mode=755 hugepages-hidden /sys/kernel/mm/hugepages
fi

layer() { # overlay the host's $1 with an upper layer in NODE_DIR
  local name=${1//\//_}
  mkdir -p "$NODE_DIR/layers/$name.upper" "$NODE_DIR/layers/$name.work"
  mount -t overlay overlay \
    -o "lowerdir=$1,upperdir=$NODE_DIR/layers/$name.upper,workdir=$NODE_DIR/layers/$name.work" "$1"
}
layer /etc
layer /usr/local
# CRI-O creates its default hooks directory (/usr/share/containers/oci/hooks.d), where the
# installer's hook mode writes.
layer /usr/share
layer /opt
layer /var/lib
for d in containerd containers kubelet log; do mkdir -p "$NODE_DIR/$d"; done
mkdir -p /var/lib/containerd /var/lib/containers /var/lib/kubelet
mount --bind "$NODE_DIR/containerd" /var/lib/containerd
mount --bind "$NODE_DIR/containers" /var/lib/containers
mount --bind "$NODE_DIR/kubelet" /var/lib/kubelet
mount --bind "$NODE_DIR/log" /var/log
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/lock /run/netns

# /dev: what a host has, plus the simulated GPUs.
mount -t tmpfs -o mode=755,nosuid tmpfs /dev
for node in null:1:3:666 zero:1:5:666 full:1:7:666 random:1:8:666 urandom:1:9:666 tty:5:0:666 kmsg:1:11:644; do
  IFS=: read -r name major minor mode <<< "$node"
  mknod -m "$mode" "/dev/$name" c "$major" "$minor"
done
mkdir -p /dev/pts /dev/shm /dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts
ln -s pts/ptmx /dev/ptmx
mount -t tmpfs -o nosuid,nodev tmpfs /dev/shm
mount -t mqueue mqueue /dev/mqueue
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
cp -a "$SIM"/dev/nvidia* /dev/

# /proc/driver/nvidia and the driver root.
mount -t tmpfs -o mode=555 tmpfs /proc/driver
cp -a "$SIM/proc/driver/nvidia" /proc/driver/
mkdir -p /run/nvidia/driver "$SIM/driver/dev"
mount --bind "$SIM/driver" /run/nvidia/driver
# A driver container's root holds the device nodes too (the runtime's dev root defaults to
# the driver root).
mount --rbind /dev /run/nvidia/driver/dev
# Volumes with HostToContainer propagation (the installer's /run/nvidia) need shared mounts.
mount --make-rshared /

# /usr/local/sbin first: the node's systemctl, and on CRI-O nodes the runc wrapper of
# scripts/cluster/node-config.sh.
export PATH=/usr/local/sbin:$PEERS:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export MOCK_NVML_CONFIG=/etc/nvshim-sim/mock-nvml.json

# The services, each restarted when it exits; /run/nvshim-node/NAME.pid names the running one.
mkdir -p /run/nvshim-node
supervise() {
  local name=$1; shift
  while :; do
    echo "== $(date -u +%T) starting $name" >> "$NODE_DIR/$name.log"
    "$@" >> "$NODE_DIR/$name.log" 2>&1 &
    echo $! > "/run/nvshim-node/$name.pid"
    wait $! || true
    sleep 1
  done
}
# `systemctl restart UNIT` for the supervised services: ends the running one and waits until its
# successor is up (socket answering), as systemd's restart of a notify unit returns. It takes
# the place of the host's systemctl in the node (/usr/local/sbin comes first in PATH).
cat > /usr/local/sbin/systemctl <<'SH'
#!/bin/sh
# The simulated node's service manager (scripts/cluster/node.sh): restart UNIT only.
[ "$1" = restart ] && [ $# = 2 ] || { echo "systemctl (simulated node): only \"restart UNIT\" is supported" >&2; exit 1; }
unit=${2%.service}
pidfile=/run/nvshim-node/$unit.pid
[ -f "$pidfile" ] || { echo "Failed to restart $unit.service: Unit $unit.service not found." >&2; exit 5; }
old=$(cat "$pidfile")
kill -TERM "$old" 2>/dev/null
i=0
while kill -0 "$old" 2>/dev/null; do i=$((i + 1)); [ $i -lt 300 ] || kill -KILL "$old"; sleep 0.1; done
case $unit in containerd) sock=/run/containerd/containerd.sock ;; crio) sock=/run/crio/crio.sock ;; *) sock= ;; esac
i=0
until [ "$(cat "$pidfile")" != "$old" ] && { [ -z "$sock" ] || [ -S "$sock" ]; }; do
  i=$((i + 1)); [ $i -lt 600 ] || { echo "Job for $unit.service failed." >&2; exit 1; }
  sleep 0.1
done
SH
chmod 755 /usr/local/sbin/systemctl

if [ "$runtime" = crio ]; then
  # The images the cluster's pods use (no registry is reachable), into CRI-O's image store.
  for image in "$NODE_DIR"/../images/*.tar; do
    name=$(tar -xOf "$image" manifest.json | jq -r '.[0].RepoTags[0]')
    skopeo --insecure-policy copy -q "docker-archive:$image" \
      "containers-storage:[overlay@/var/lib/containers/storage+/run/containers/storage]$name" \
      >> "$NODE_DIR/images.log" 2>&1
  done
  rm -f /run/crio/crio.sock
  supervise crio crio &
  while [ ! -S /run/crio/crio.sock ]; do sleep 0.2; done
else
  supervise containerd containerd --config /etc/containerd/config.toml &
  while [ ! -S /run/containerd/containerd.sock ]; do sleep 0.2; done
  # The images the cluster's pods use (no registry is reachable): pause, busybox, ours.
  for image in "$NODE_DIR"/../images/*.tar; do
    ctr -n k8s.io images import "$image" >> "$NODE_DIR/images.log" 2>&1
  done
fi
echo ready > "$NODE_DIR/ready"
supervise kubelet kubelet --config=/etc/kubernetes/kubelet.yaml \
  --kubeconfig=/etc/kubernetes/kubelet.kubeconfig --hostname-override="$NODE" \
  --node-ip="$NODE_IP" --v=2 &
wait
