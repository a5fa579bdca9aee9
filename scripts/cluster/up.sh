#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make cluster`: a Kubernetes cluster of simulated GPU nodes on this machine (needs root).
#
#   control plane   etcd, kube-apiserver (https://10.200.0.1:6443), kube-controller-manager,
#                   kube-scheduler: processes of this host, on the bridge nvshim0 (10.200.0.1/24)
#   nodes           nvshim-node1 (4× A100-SXM4-80GB), nvshim-node2 (2× H100 80GB HBM3), each in
#                   network, mount, PID and UTS namespaces of its own (scripts/cluster/node.sh):
#                   containerd 2 (config version 3) or CRI-O (CLUSTER_RUNTIME=crio) + runc + CNI
#                   bridge, and kubelet; pods on node N get 10.244.N.0/24
#   images          built locally (scripts/cluster/images.sh) and imported into each node
#   NFD             Node Feature Discovery's own deployment (scripts/cluster/nfd.sh): GPU labels
#                   reach the Nodes
#   install         CLUSTER_INSTALL=helm (default): our chart with Helm v4; =kustomize: the
#                   containerd overlay with kubectl apply -k; =none: a bare cluster
#
# Variables: NVSHIM_CLUSTER_DIR (default /var/tmp/nvshim-cluster), CLUSTER_NODES (1 or 2,
# default 2), CLUSTER_RUNTIME (containerd or crio), CLUSTER_INSTALL, NVSHIM_PEERS_CACHE (the peers'
# cache, scripts/build-peers.sh), NVSHIM_BIN_DIR (our binaries, default target/debug; built
# when missing). `make cluster-down` (scripts/cluster/down.sh) stops and removes it all.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

dir=${NVSHIM_CLUSTER_DIR:-/var/tmp/nvshim-cluster}
nodes=${CLUSTER_NODES:-2}
runtime=${CLUSTER_RUNTIME:-containerd}
install=${CLUSTER_INSTALL:-helm}
cache=${NVSHIM_PEERS_CACHE:-/var/cache/nvshim-ci/peers}
peers=$cache/bin
bin=${NVSHIM_BIN_DIR:-$repo/target/debug}
ip=10.200.0.1
tag=0.1.0-cluster

fail() { echo "cluster: $*" >&2; exit 1; }
step() { printf '== %s (%ss)\n' "$1" "$SECONDS"; }

[ "$(id -u)" = 0 ] || fail "run as root (namespaces, mknod, mounts)"
case $nodes in 1|2) ;; *) fail "CLUSTER_NODES=$nodes: valid values are 1 and 2" ;; esac
case $runtime in
  containerd) ;;
  crio)
    for tool in skopeo conmon; do
      command -v "$tool" >/dev/null || fail "$tool is not on PATH (CLUSTER_RUNTIME=crio: Debian's $tool)"
    done ;;
  *) fail "CLUSTER_RUNTIME=$runtime: valid values are containerd and crio" ;;
esac
case $install in helm|kustomize|none) ;; *) fail "CLUSTER_INSTALL=$install: valid values are helm, kustomize and none" ;; esac
[ ! -e "$dir/cluster.env" ] || fail "a cluster is up in $dir already (make cluster-down first)"
# One cluster at a time: the bridge and the addresses are fixed.
! ip link show nvshim0 >/dev/null 2>&1 ||
  fail "another cluster holds the bridge nvshim0 (NVSHIM_CLUSTER_DIR=<its directory> make cluster-down)"
for tool in ip unshare nsenter openssl gcc ldd busybox sha256sum iptables jq; do
  command -v "$tool" >/dev/null || fail "$tool is not on PATH (scripts/cluster-prereqs.sh installs what the cluster needs)"
done
[ -x /usr/lib/cni/bridge ] || fail "the CNI plugins are missing (/usr/lib/cni/bridge: Debian's containernetworking-plugins)"

step "peers"
bash scripts/build-peers.sh "$cache"
step "our binaries"
want=(nvshim nvidia-device-plugin nvidia-container-runtime nvidia-container-runtime-hook nvshim-simnode)
for b in "${want[@]}"; do
  if [ ! -x "$bin/$b" ]; then
    [ -z "${NVSHIM_BIN_DIR:-}" ] || fail "$bin/$b is missing"
    cargo build --workspace
    break
  fi
done
runtime_dir=$repo/target/static/release
[ -x "$runtime_dir/nvidia-container-runtime" ] || runtime_dir=$bin

mkdir -p "$dir"
node_names=()
for n in $(seq 1 "$nodes"); do node_names+=("nvshim-node$n"); done

step "simulated GPU nodes"
for n in $(seq 1 "$nodes"); do
  model=a100 gpus=4
  [ "$n" = 2 ] && model=h100 gpus=2
  "$bin/nvshim-simnode" "$dir/sim$n" --gpus "$gpus" --model "$model" > "$dir/sim$n.env"
done

step "images"
nfd_version=$(awk -F= '$1 == "NFD" {print $2}' tests/peers/versions.env)
bash scripts/cluster/images.sh "$dir/images" "$bin" "$runtime_dir" "$dir/sim1" "$tag" "$peers" "$nfd_version" \
  > "$dir/images.log"

step "certificates"
bash scripts/cluster/pki.sh "$dir" "$ip" "${node_names[*]}"

# Everything down.sh needs, written before anything starts.
cat > "$dir/cluster.env" <<EOF
nodes=$nodes
ip=$ip
runtime=$runtime
EOF

step "network"
ip link add nvshim0 type bridge
ip addr add "$ip/24" dev nvshim0
ip link set nvshim0 up
for n in $(seq 1 "$nodes"); do
  ns=nvshim-node$n
  ip netns add "$ns"
  ip link add "nvshim-veth$n" type veth peer name eth0 netns "$ns"
  ip link set "nvshim-veth$n" master nvshim0 up
  ip -n "$ns" addr add "10.200.0.1$n/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" route add default via "$ip"
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
  # No kube-proxy: the one Service pods need, the API server's (the in-cluster config's
  # 10.96.0.1:443), by a DNAT in the node, for pods and for the node's own processes.
  for chain in PREROUTING OUTPUT; do
    ip netns exec "$ns" iptables -t nat -A "$chain" -d 10.96.0.1/32 -p tcp --dport 443 \
      -j DNAT --to-destination "$ip:6443"
  done
  # The API server reaches the node's pods (proxy, port-forward) through the node.
  ip route add "10.244.$n.0/24" via "10.200.0.1$n"
done

# The sysctls kubelet rewrites at start (host-wide), put back by down.sh.
for key in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
  echo "$key=$(cat "/proc/sys/$key")"
done > "$dir/sysctls.saved"

step "control plane"
# daemon NAME COMMAND...: runs in the background in a session of its own, logs to NAME.log.
daemon() {
  local name=$1; shift
  setsid "$@" > "$dir/$name.log" 2>&1 < /dev/null &
  echo $! > "$dir/$name.pid"
}
pki=$dir/pki
daemon etcd "$peers/etcd" --name cp --data-dir "$dir/etcd" \
  --listen-client-urls http://127.0.0.1:32379 --advertise-client-urls http://127.0.0.1:32379 \
  --listen-peer-urls http://127.0.0.1:32380 --initial-advertise-peer-urls http://127.0.0.1:32380 \
  --initial-cluster cp=http://127.0.0.1:32380 --listen-metrics-urls= --log-level=warn
daemon kube-apiserver "$peers/kube-apiserver" --etcd-servers=http://127.0.0.1:32379 \
  --bind-address="$ip" --advertise-address="$ip" --secure-port=6443 \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/16 --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction --allow-privileged=true \
  --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP
export KUBECONFIG=$dir/admin.kubeconfig
kubectl=$peers/kubectl
for _ in $(seq 1 150); do
  "$kubectl" get --raw /readyz >/dev/null 2>&1 && break
  sleep 0.4
done
"$kubectl" get --raw /readyz >/dev/null || { tail -n 30 "$dir/kube-apiserver.log" >&2; fail "the API server did not get ready"; }
daemon kube-controller-manager "$peers/kube-controller-manager" \
  --kubeconfig="$dir/controller-manager.kubeconfig" --leader-elect=false \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --use-service-account-credentials=true --cluster-signing-cert-file="$pki/ca.crt" \
  --cluster-signing-key-file="$pki/ca.key" --bind-address=127.0.0.1 --secure-port=0
daemon kube-scheduler "$peers/kube-scheduler" --kubeconfig="$dir/scheduler.kubeconfig" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port=0

step "nodes"
for n in $(seq 1 "$nodes"); do
  bash scripts/cluster/node-config.sh "$dir" "$n" "$peers" "$runtime"
  node=nvshim-node$n
  NODE=$node NODE_DIR=$dir/node$n SIM=$dir/sim$n PEERS=$peers NODE_IP=10.200.0.1$n RUNTIME=$runtime \
    setsid ip netns exec "nvshim-node$n" unshare --mount --uts --pid --fork --kill-child \
    bash "$repo/scripts/cluster/node.sh" > "$dir/node$n/init.log" 2>&1 < /dev/null &
  echo $! > "$dir/node$n.pid"
done
for n in $(seq 1 "$nodes"); do
  for _ in $(seq 1 300); do [ -e "$dir/node$n/ready" ] && break; sleep 0.2; done
  [ -e "$dir/node$n/ready" ] || { tail -n 20 "$dir/node$n/init.log" "$dir/node$n/$runtime.log" >&2; fail "node $n did not start"; }
  # The node's PID 1 as this host numbers it (unshare's child): nsenter -t enters the node.
  upid=$(cat "$dir/node$n.pid")
  cut -d' ' -f1 "/proc/$upid/task/$upid/children" > "$dir/node$n/init.pid"
done
ready=0
for _ in $(seq 1 240); do
  ready=$("$kubectl" get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)
  [ "$ready" = "$nodes" ] && break
  sleep 0.5
done
if [ "$ready" != "$nodes" ]; then
  "$kubectl" get nodes >&2 || true
  for n in $(seq 1 "$nodes"); do grep -E '^E[0-9]{4}' "$dir/node$n/kubelet.log" | tail -n 10 >&2; done
  fail "$ready of $nodes nodes got Ready in 120 s"
fi
for node in "${node_names[@]}"; do
  # The chart's node affinity: NFD labels a GPU node feature.node.kubernetes.io/pci-10de.present
  # from its PCI devices, which a simulated node has none of; this is the documented other label.
  "$kubectl" label node "$node" nvidia.com/gpu.present=true --overwrite >/dev/null
done

step "node feature discovery"
bash scripts/cluster/nfd.sh "$dir"

step "install ($install)"
bash scripts/cluster/install.sh "$install" "$dir" "$tag"

cat <<EOF
== the cluster is up (${SECONDS}s): ${node_names[*]}
export KUBECONFIG=$dir/admin.kubeconfig PATH=$peers:\$PATH
EOF
