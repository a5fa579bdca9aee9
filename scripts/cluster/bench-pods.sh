#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make bench-cluster`: pod start latency on the cluster of `make cluster` (brought up here with
# one node when none is up, and taken down again). For ROUNDS rounds (default 50), in turn: a
# CPU pod on the default runtime (runc) and a GPU pod (`runtimeClassName: nvidia`,
# `nvidia.com/gpu: 1`, through our runtime), both busybox `sleep`, on nvshim-node1. Each
# figure is the wall time from `kubectl create` until `kubectl wait --for=condition=Ready`
# returns (a watch, so no polling interval), the same client overhead in both columns; each
# pod is deleted (untimed) before the next. Prints a table: median, p90, mean, and the ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-50}
dir=${NVSHIM_CLUSTER_DIR:-/var/tmp/nvshim-cluster}
peers=${NVSHIM_PEERS_CACHE:-/var/cache/nvshim-ci/peers}/bin
kubectl=$peers/kubectl
export KUBECONFIG=$dir/admin.kubeconfig

own=0
if [ ! -e "$dir/cluster.env" ]; then
  CLUSTER_NODES=1 bash scripts/cluster/up.sh >/dev/null
  own=1
fi
trap '[ "$own" = 1 ] && bash scripts/cluster/down.sh >/dev/null' EXIT

# start KIND: creates the pod, prints the milliseconds until it is Ready, deletes it.
start() {
  local kind=$1 name="bench-$1" extra="" t0 t1
  [ "$kind" = gpu ] && extra='runtimeClassName: nvidia'
  local limits='{}'
  [ "$kind" = gpu ] && limits='{limits: {nvidia.com/gpu: 1}}'
  t0=$(date +%s%N)
  "$kubectl" create -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: default}
spec:
  $extra
  nodeSelector: {kubernetes.io/hostname: nvshim-node1}
  terminationGracePeriodSeconds: 0
  containers:
    - name: main
      image: localhost/busybox:latest
      imagePullPolicy: Never
      command: [sleep, "3600"]
      resources: $limits
EOF
  "$kubectl" wait --for=condition=Ready "pod/$name" --timeout=120s >/dev/null 2>&1
  t1=$(date +%s%N)
  "$kubectl" delete pod "$name" --wait=true --grace-period=0 >/dev/null 2>&1
  echo $(((t1 - t0) / 1000000))
}

cpu=() gpu=()
start cpu >/dev/null; start gpu >/dev/null   # warm-up: images unpacked, plugin streams open
for _ in $(seq 1 "$rounds"); do
  cpu+=("$(start cpu)")
  gpu+=("$(start gpu)")
done

stats() { # median p90 mean of the arguments
  printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1; s+=$1} END {
    printf "%d %d %d", v[int((NR+1)/2)], v[int(NR*0.9+0.5)], s/NR }'
}
read -r cm cp cmean <<< "$(stats "${cpu[@]}")"
read -r gm gp gmean <<< "$(stats "${gpu[@]}")"
echo "pod create -> Ready, $rounds rounds each, $(date -u +%F), $(nproc) cores"
printf '| pod | median ms | p90 ms | mean ms |\n| --- | --- | --- | --- |\n'
printf '| CPU, runc | %d | %d | %d |\n' "$cm" "$cp" "$cmean"
printf '| nvidia.com/gpu: 1, nvidia runtime class | %d | %d | %d |\n' "$gm" "$gp" "$gmean"
awk -v g="$gm" -v c="$cm" 'BEGIN { printf "GPU/CPU (medians): %.3fx\n", g / c }'
