#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The files of node N of `make cluster`, written into the upper layer of its /etc (which
# scripts/cluster/node.sh mounts over the host's): node-config.sh DIR N PEERS RUNTIME
#   /etc/containerd/config.toml      (containerd) containerd 2, config version 3, as a
#                                    distribution ships it plus the CRI sandbox image and runc's
#                                    base spec
#   /etc/crio/crio.conf              (crio) CRI-O with runc, Debian's conmon, cgroupfs, the
#                                    sandbox image; the mock NVML's config by default_env and
#                                    default_mounts_file, as runc's base spec gives it under
#                                    containerd
#   /etc/cni/net.d/10-nvshim.conflist  a bridge network, pods in 10.244.N.0/24
#   /etc/kubernetes/                 kubelet's config, kubeconfig and the cluster CA
#   /etc/nvshim-sim/                 the mock NVML's config (dev root /dev) and XID event file,
#                                    and base-spec.json: runc's default spec plus that
#                                    directory and MOCK_NVML_CONFIG, so every container finds
#                                    the node's "driver" state as real NVML finds the kernel's
set -euo pipefail
dir=$1 n=$2 peers=$3 runtime=${4:-containerd}
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

if [ "$runtime" = crio ]; then
  mkdir -p "$etc/crio/crio.conf.d"
  echo "$sim:$sim" > "$etc/nvshim-sim/crio-mounts.conf"
  cat > "$etc/crio/crio.conf" <<EOF
[crio]
root = "/var/lib/containers/storage"
runroot = "/run/containers/storage"
storage_driver = "overlay"

[crio.api]
listen = "/run/crio/crio.sock"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
pinns_path = "$peers/pinns"
default_env = ["MOCK_NVML_CONFIG=$sim/mock-nvml.json"]
default_mounts_file = "$sim/crio-mounts.conf"

[crio.runtime.runtimes.runc]
runtime_path = "/usr/local/sbin/runc"
runtime_type = "oci"
runtime_root = "/run/runc"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

[crio.image]
pause_image = "localhost/pause:3.10"
signature_policy = "/etc/crio/policy.json"

[crio.network]
network_dir = "/etc/cni/net.d"
plugin_dirs = ["/usr/lib/cni"]
EOF
  echo '{"default": [{"type": "insecureAcceptAnything"}]}' > "$etc/crio/policy.json"
  # runc as this VM lets CRI-O run it. CRI-O grants a privileged container every capability
  # the kernel knows and passes kubelet's negative oom_score_adj of critical and Guaranteed
  # pods on; this host's bounding set lacks some capabilities (CAP_SYS_RESOURCE), without
  # which runc can do neither. containerd does both itself (privileged gets the current
  # capabilities; restrict_oom_score_adj above), so only CRI-O nodes get this wrapper, first
  # in the node's PATH (scripts/cluster/node.sh), which CRI-O's runc handler and our runtime
  # (it looks runc up in PATH) both exec: it drops what the host lacks from config.json and
  # clamps oom_score_adj at its own, then execs the real runc.
  caps=(chown dac_override dac_read_search fowner fsetid kill setgid setuid setpcap linux_immutable
    net_bind_service net_broadcast net_admin net_raw ipc_lock ipc_owner sys_module sys_rawio
    sys_chroot sys_ptrace sys_pacct sys_admin sys_boot sys_nice sys_resource sys_time
    sys_tty_config mknod lease audit_write audit_control setfcap mac_override mac_admin syslog
    wake_alarm block_suspend audit_read perfmon bpf checkpoint_restore)
  bounding=$((16#$(awk '$1 == "CapBnd:" {print $2}' /proc/self/status)))
  missing=()
  for i in "${!caps[@]}"; do
    (( bounding >> i & 1 )) || missing+=("\"CAP_${caps[i]^^}\"")
  done
  missing_json="[$(IFS=,; echo "${missing[*]}")]"
  mkdir -p "$dir/node$n/layers/_usr_local.upper/sbin"
  cat > "$dir/node$n/layers/_usr_local.upper/sbin/runc" <<EOF
#!/bin/sh
# runc for a CRI-O node of this VM (scripts/cluster/node-config.sh says why): create and run
# get config.json, exec its --process file, cleared of capabilities the host lacks.
bundle=. process= prev= verb=
for a in "\$@"; do
  case \$prev in --bundle|-b) bundle=\$a ;; --process|-p) process=\$a ;; esac
  case \$a in
    --bundle=*) bundle=\${a#--bundle=} ;;
    --process=*) process=\${a#--process=} ;;
    create|run|exec) [ -n "\$verb" ] || verb=\$a ;;
  esac
  prev=\$a
done
# clamp FILE FILTER: rewrites FILE through jq FILTER.
clamp() {
  jq --argjson min "\$(cat /proc/self/oom_score_adj)" --argjson missing '$missing_json' "\$2" "\$1" \
    > "\$1.clamped" && mv -f "\$1.clamped" "\$1"
}
drop='map_values(if type == "array" then map(select(IN(\$missing[]) | not)) else . end)'
case \$verb in
  create|run)
    [ ! -f "\$bundle/config.json" ] || clamp "\$bundle/config.json" "
      if .process.capabilities then .process.capabilities |= \$drop else . end
      | if (.process.oomScoreAdj // 0) < \\\$min then .process.oomScoreAdj = \\\$min else . end" ;;
  exec)
    [ -z "\$process" ] || [ ! -f "\$process" ] || clamp "\$process" "if .capabilities then .capabilities |= \$drop else . end" ;;
esac
exec $peers/runc "\$@"
EOF
  chmod 755 "$dir/node$n/layers/_usr_local.upper/sbin/runc"
else
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
fi

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

socket=/run/containerd/containerd.sock
[ "$runtime" != crio ] || socket=/run/crio/crio.sock
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
containerRuntimeEndpoint: unix://$socket
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
