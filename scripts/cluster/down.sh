#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make cluster-down`: stops what scripts/cluster/up.sh started and removes it all: the nodes
# (killing a node's PID 1 ends its containers and drops its mounts), the control plane, the
# network (bridge, veths, namespaces, routes), the kernel settings kubelet changed, the
# cgroups the nodes' containers left, and NVSHIM_CLUSTER_DIR. Safe to run twice.
set -uo pipefail
dir=${NVSHIM_CLUSTER_DIR:-/var/tmp/nvshim-cluster}
[ "$(id -u)" = 0 ] || { echo "cluster-down: run as root" >&2; exit 1; }
[ -d "$dir" ] || { echo "cluster-down: no cluster in $dir"; exit 0; }

stop() { # stop PIDFILE: SIGTERM, then SIGKILL after 10 s
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  kill -9 "$pid" 2>/dev/null
}
for f in "$dir"/node*.pid; do
  [ -e "$f" ] || continue
  # The node's PID 1 (unshare's child): killing it ends every process in the node.
  init=$(cat "${f%.pid}/init.pid" 2>/dev/null) && kill -9 "$init" 2>/dev/null
  stop "$f"
done
for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop "$dir/$name.pid"
done
for ns in $(ip netns list 2>/dev/null | awk '/^nvshim-node/ {print $1}'); do
  ip netns delete "$ns"
done
ip link delete nvshim0 2>/dev/null
for route in $(ip route show 2>/dev/null | awk '$1 ~ /^10\.244\./ && $3 ~ /^10\.200\.0\./ {print $1}'); do
  ip route delete "$route" 2>/dev/null
done
if [ -f "$dir/sysctls.saved" ]; then
  while IFS='=' read -r key value; do echo "$value" > "/proc/sys/$key"; done < "$dir/sysctls.saved"
fi
# Containers' cgroups (containerd's k8s.io parent, kubelet's, CRI-O's crio-<id> at the root),
# once their processes are gone (rmdir takes only empty ones).
for root in /sys/fs/cgroup/*/; do
  for top in "$root"k8s.io "$root"kubepods "$root"crio "$root"crio-*; do
    [ -d "$top" ] && find "$top" -depth -type d -exec rmdir {} + 2>/dev/null
  done
done
# Mounts left below the directory (none should be: they were in the nodes' namespaces).
grep -F " $dir/" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
rm -rf "$dir"
echo "cluster-down: removed $dir"
