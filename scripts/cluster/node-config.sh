#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The files of node N of `make cluster`, written into the upper layer of its /etc (which
# scripts/cluster/node.sh mounts over the host's): node-config.sh DIR N PEERS
#   /etc/containerd/config.toml      containerd 2, config version 3, as a distribution ships
#                                    it plus the CRI sandbox image and runc's base spec
#   /etc/cni/net.d/10-nvshim.conflist  a bridge network, pods in 10.244.N.0/24
#   /etc/kubernetes/                 kubelet's config, kubeconfig and the cluster CA
#   /etc/nvshim-sim/                 the mock NVML's config (dev root /dev) and XID event file,
#                                    and base-spec.json: runc's default spec plus that
#                                    directory and MOCK_NVML_CONFIG, so every container finds
#                                    the node's "driver" state as real NVML finds the kernel's
set -euo pipefail
dir=$1 n=$2 peers=$3
node=nvshim-node$n
etc=$dir/node$n/layers/_etc.upper
mkdir -p "$etc/containerd" "$etc/cni/net.d" "$etc/kubernetes/pki" "$etc/kubernetes/manifests" "$etc/nvshim-sim"

sim=/etc/nvshim-sim
jq --arg sim "$sim" '.dev_root = "/dev" | .event_file = ($sim + "/xid-events")' \
  "$dir/sim$n/mock-nvml.json" > "$etc/nvshim-sim/mock-nvml.json"
: > "$etc/nvshim-sim/xid-events"
"$peers/ctr" oci spec | jq --arg sim "$sim" '
  .process.env += ["MOCK_NVML_CONFIG=" + $sim + "/mock-nvml.json"]
  | .mounts += [{destination: $sim, type: "bind", source: $sim, options: ["rbind", "ro"]}]' \
  > "$etc/nvshim-sim/base-spec.json"

cat > "$etc/containerd/config.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "localhost/pause:3.10"

[plugins."io.containerd.cri.v1.runtime"]
  # This VM refuses a lower oom_score_adj than the parent's (kubelet asks -998 for sandboxes).
  restrict_oom_score_adj = true

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "$sim/base-spec.json"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "$peers/runc"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "/etc/cni/net.d"
EOF

cat > "$etc/cni/net.d/10-nvshim.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "nvshim",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.244.$n.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF

cp "$dir/pki/ca.crt" "$etc/kubernetes/pki/ca.crt"
cp "$dir/kubelet-$node.kubeconfig" "$etc/kubernetes/kubelet.kubeconfig"
# No QoS cgroup tree and no node-allocatable enforcement: this host's cgroup v1 hierarchy has
# no hugetlb controller, and two kubelets share it. No eviction or image GC on a shared disk.
cat > "$etc/kubernetes/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 10.200.0.1$n
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
staticPodPath: /etc/kubernetes/manifests
volumePluginDir: /var/lib/kubelet/volume-plugins
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi"}
serializeImagePulls: false
resolvConf: /etc/resolv.conf
EOF
