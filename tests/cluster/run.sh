#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make test-cluster`: nvshim on a live Kubernetes cluster (scripts/cluster/up.sh: the current
# kube-apiserver, scheduler, controller manager and kubelet, containerd 2, two simulated GPU
# nodes, NFD), installed by the real Helm, then GPU pods end to end (tests/cluster/cases.sh);
# then the same on a one-node CRI-O cluster (tests/cluster/crio_cases.sh).
# Each case prints PASS or FAIL with what it saw; the last line is "N passed, N failed".
# The cluster is taken down at the end, whatever happened (NVSHIM_KEEP_CLUSTER=1 keeps it).
set -uo pipefail
cd "$(dirname "$0")/../.."

export NVSHIM_CLUSTER_DIR=${NVSHIM_CLUSTER_DIR:-/var/tmp/nvshim-cluster-test}
dir=$NVSHIM_CLUSTER_DIR
peers=${NVSHIM_PEERS_CACHE:-/var/cache/nvshim-ci/peers}/bin
export KUBECONFIG=$dir/admin.kubeconfig
kubectl=$peers/kubectl
helm=$peers/helm

passed=0 failed=0 failures=()
# case NAME FUNCTION: runs FUNCTION, which returns non-zero and prints why on failure.
case_() {
  local name=$1 fn=$2 out start=$SECONDS
  if out=$("$fn" 2>&1); then
    passed=$((passed + 1))
    printf 'PASS %s (%ss)\n' "$name" "$((SECONDS - start))"
  else
    failed=$((failed + 1))
    failures+=("$name")
    printf 'FAIL %s (%ss)\n%s\n' "$name" "$((SECONDS - start))" "$(sed 's/^/    /' <<< "$out" | tail -n 60)"
  fi
}

finish() {
  if [ "${NVSHIM_KEEP_CLUSTER:-0}" != 1 ]; then
    bash scripts/cluster/down.sh > /dev/null 2>&1 || true
  fi
  [ "${#failures[@]}" = 0 ] || echo "failed: ${failures[*]}"
  echo "$passed passed, $failed failed"
  [ "$failed" = 0 ]
}

# up NAME VAR=VALUE...: a bare cluster (up.sh with the variables); on failure the logs'
# tails, the summary, and the end of the run.
up() {
  local name=$1; shift
  if ! env "$@" CLUSTER_INSTALL=none bash scripts/cluster/up.sh; then
    failed=$((failed + 1)) failures+=("$name")
    for f in "$dir"/*.log "$dir"/node*/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }; done
    finish
    exit 1
  fi
}

[ ! -e "$dir/cluster.env" ] || bash scripts/cluster/down.sh > /dev/null
up "cluster up" CLUSTER_RUNTIME=containerd

. tests/cluster/cases.sh

case_ "helm install: the installer configures containerd 2, the plugin registers, capacity = GPUs" helm_install
case_ "installer: config v3 drop-in, imported by config.toml, runtime restarted, ready file" installer_configured
case_ "validation Job completes" validation_job
case_ "nvidia.com/gpu: 2 sees exactly two GPUs (nvidia-smi -L and /dev)" two_gpus
case_ "pods on both nodes get the node's own GPU model" models_per_node
case_ "image env NVIDIA_VISIBLE_DEVICES=all without a GPU limit sees no GPU" image_env_is_not_an_allocation
case_ "nvidia.com/gpu: 1 with the image's NVIDIA_VISIBLE_DEVICES=all sees one GPU" one_gpu_not_all
case_ "a pod asking for more GPUs than any node has stays Pending" too_many_gpus
case_ "exporter: DCGM series name the GPU pod's namespace, pod and container" exporter_names_the_pod
case_ "labels: each node's features.d file names its own GPUs" gfd_labels_per_node
case_ "NFD: GFD's labels reach each Node (features.d -> NFD worker -> NodeFeature -> NFD master)" nfd_labels_on_nodes
case_ "pods placed by GPU labels (model, memory, compute capability) land on the node that has them" scheduled_by_labels
case_ "helm upgrade of the toolkit to other bytes while GPU pods start in a loop: none fails" toolkit_upgrade_under_load
case_ "helm upgrade of the plugin to other bytes under the loop: only kubelet's admission window" plugin_upgrade_under_load
case_ "deviceListStrategy envvar (NVIDIA's toolkit defaults): two GPUs by the env var" envvar_strategy
case_ "deviceListStrategy cdi-cri: two GPUs by containerd 2's CDI, with and without the runtime class" cdi_cri_strategy
case_ "time-slicing: replicas 4 make capacity 4x the GPUs; a replica shows one GPU" time_slicing_multiplies_capacity
case_ "helm uninstall: containerd's config byte-identical, nothing of ours left" helm_uninstall
case_ "kubectl apply -k (containerd overlay): validation, two GPUs, image env no allocation, NodeFeature labels" kustomize_install
case_ "kubectl delete -k: containerd's config byte-identical, nothing of ours left" kustomize_delete

# CRI-O: a one-node cluster of its own.
bash scripts/cluster/down.sh > /dev/null
up "CRI-O cluster up" CLUSTER_RUNTIME=crio CLUSTER_NODES=1
. tests/cluster/crio_cases.sh
case_ "CRI-O: helm install, the drop-in (a copy of runc's handler), CRI-O restarted, validation" crio_helm_install
case_ "CRI-O: two GPUs, image env no allocation, one GPU" crio_gpus
case_ "CRI-O: deviceListStrategy cdi-cri, CRI-O's CDI, with and without the runtime class" crio_cdi_cri
case_ "CRI-O: helm uninstall, crio.conf byte-identical, CRI-O restarted, nothing of ours left" crio_helm_uninstall
case_ "CRI-O: installer.crioConfigMode=hook, the OCI hook in hooks.d, no RuntimeClass, GPUs by allocation" crio_hook_install
case_ "CRI-O: helm uninstall of the hook mode, CRI-O restarted, nothing of ours left" crio_helm_uninstall
case_ "CRI-O: kubectl apply -k (crio overlay): drop-in, restart, validation, two GPUs, image env" crio_kustomize_install
case_ "CRI-O: kubectl delete -k, crio.conf byte-identical, nothing of ours left" crio_kustomize_delete

finish
