#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The cases of `make test-cluster` (sourced by tests/cluster/run.sh, which sets dir, kubectl,
# helm and KUBECONFIG). Each returns non-zero and says what it saw when it fails.

tag=0.1.0-cluster
busybox=localhost/busybox:latest
# The simulated nodes' GPUs (scripts/cluster/up.sh): node 1 four A100s, node 2 two H100s.
node1_gpus=4
node2_gpus=2

# node_exec N COMMAND...: runs COMMAND in node N's namespaces (its /etc, /run, processes).
node_exec() {
  local n=$1; shift
  nsenter -t "$(cat "$dir/node$n/init.pid")" -m -u -p -n -- "$@"
}

# pod NAME NODE GPUS [RUNTIME_CLASS] [SHELL]: creates a pod running SHELL in busybox (with
# glibc and NVIDIA_VISIBLE_DEVICES=all in its env, as a CUDA image has) on node NODE, with a
# limit of GPUS nvidia.com/gpu (0: none), through RUNTIME_CLASS (default nvidia; "": none).
pod() {
  pod_placed "$1" "nodeSelector: {kubernetes.io/hostname: $2}" "${@:3}"
}

# pod_placed NAME PLACEMENT GPUS [RUNTIME_CLASS] [SHELL]: `pod` with PLACEMENT (a line of the
# pod's spec: a nodeSelector or an affinity) instead of a node.
pod_placed() {
  local name=$1 placement=$2 gpus=$3 class=${4-nvidia}
  local shell=${5:-"nvidia-smi -L || echo no-nvidia-smi; ls /dev | grep -E '^nvidia[0-9]+\$' | sed 's/^/dev: /'"}
  local limits="{}" class_line=""
  [ "$gpus" = 0 ] || limits="{limits: {nvidia.com/gpu: $gpus}}"
  [ -z "$class" ] || class_line="runtimeClassName: $class"
  "$kubectl" delete pod "$name" --ignore-not-found --wait=true >/dev/null 2>&1
  "$kubectl" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: default}
spec:
  restartPolicy: Never
  $class_line
  $placement
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: $busybox
      imagePullPolicy: Never
      command: [sh, -c, "$shell"]
      resources: $limits
EOF
}

# finished NAME: waits for the pod to end (Succeeded or Failed) and prints its log.
finished() {
  local name=$1 phase=
  for _ in $(seq 1 240); do
    phase=$("$kubectl" get pod "$name" -o jsonpath='{.status.phase}' 2>/dev/null)
    case $phase in Succeeded|Failed) break ;; esac
    sleep 0.5
  done
  if [ "$phase" != Succeeded ]; then
    echo "pod $name: phase \"$phase\""
    "$kubectl" describe pod "$name" | tail -n 25
    "$kubectl" logs "$name" 2>&1 | tail -n 20
    return 1
  fi
  "$kubectl" logs "$name"
}

count() { grep -c "$1" <<< "$2" || true; }

helm_install() {
  for n in $(seq 1 "$(awk -F= '$1 == "nodes" {print $2}' "$dir/cluster.env")"); do
    node_exec "$n" cat /etc/containerd/config.toml > "$dir/config.toml.before-$n" || return 1
  done
  NVSHIM_HELM_ARGS="--set exporter.enabled=true --set gfd.enabled=true" \
    bash scripts/cluster/install.sh helm "$dir" "$tag" || return 1
  local status
  status=$("$helm" status nvshim -n nvshim -o json | jq -r .info.status)
  [ "$status" = deployed ] || { echo "helm status: \"$status\""; return 1; }
}

installer_configured() {
  local dropin config starts
  dropin=$(node_exec 1 cat /etc/containerd/conf.d/99-nvidia.toml) || { echo "no drop-in"; return 1; }
  grep -q '^version = 3' <<< "$dropin" || { echo "the drop-in is not config version 3:"; echo "$dropin"; return 1; }
  grep -q 'plugins\."io\.containerd\.cri\.v1\.runtime"\.containerd\.runtimes\.nvidia' <<< "$dropin" ||
    { echo "no nvidia runtime for the v3 CRI runtime plugin in the drop-in:"; echo "$dropin"; return 1; }
  grep -q 'BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"' <<< "$dropin" ||
    { echo "the nvidia runtime does not run the installed runtime:"; echo "$dropin"; return 1; }
  config=$(node_exec 1 cat /etc/containerd/config.toml)
  grep -qE '^imports = \[.*"/etc/containerd/conf\.d/(\*|99-nvidia)\.toml"' <<< "$config" || { echo "config.toml does not import the drop-in:"; echo "$config"; return 1; }
  node_exec 1 test -x /usr/local/nvidia/toolkit/nvidia-container-runtime || { echo "no runtime in the toolkit dir"; return 1; }
  node_exec 1 test -f /run/nvidia/validations/toolkit-ready || { echo "no ready file"; return 1; }
  starts=$(grep -c 'starting containerd' "$dir/node1/containerd.log")
  [ "$starts" -ge 2 ] || { echo "containerd started $starts time(s): the installer did not restart it"; return 1; }
  # The restarted containerd has the runtime: a RuntimeClass pod ran (capacity came from a
  # plugin pod started through it).
  node_exec 1 "$peers/ctr" -n k8s.io containers list -q >/dev/null
}

validation_job() {
  local job
  job=$("$kubectl" -n nvshim get jobs -o name | head -n1)
  [ -n "$job" ] || { echo "no validation Job"; "$kubectl" -n nvshim get all; return 1; }
  "$kubectl" -n nvshim wait --for=condition=complete "$job" --timeout=120s ||
    { "$kubectl" -n nvshim describe "$job" | tail -n 20; "$kubectl" -n nvshim logs "$job" | tail -n 20; return 1; }
}

# sees NAME NODE GPUS WANT [CLASS]: a pod on NODE with a limit of GPUS nvidia.com/gpu (0: none)
# through runtime class CLASS (default nvidia; "": none) sees exactly WANT GPUs: in
# nvidia-smi -L, as /dev/nvidiaN, and as distinct UUIDs.
sees() {
  local name=$1 node=$2 gpus=$3 want=$4 out
  pod "$name" "$node" "$gpus" "${5-nvidia}"
  out=$(finished "$name") || { echo "$out"; return 1; }
  echo "$out"
  [ "$(count '^GPU [0-9]' "$out")" = "$want" ] || { echo "nvidia-smi -L did not list $want GPU(s)"; return 1; }
  [ "$(count '^dev: ' "$out")" = "$want" ] || { echo "not $want /dev/nvidiaN"; return 1; }
  [ "$(grep -o 'GPU-[0-9a-f-]*' <<< "$out" | sort -u | wc -l)" = "$want" ] || { echo "not $want distinct UUIDs"; return 1; }
  "$kubectl" delete pod "$name" --wait=false >/dev/null
}

two_gpus() { sees two-gpus nvshim-node1 2 2; }

models_per_node() {
  local out
  pod a100 nvshim-node1 1
  pod h100 nvshim-node2 1
  out=$(finished a100) || { echo "$out"; return 1; }
  grep -q 'GPU 0: NVIDIA A100-SXM4-80GB' <<< "$out" || { echo "node 1: $out"; return 1; }
  out=$(finished h100) || { echo "$out"; return 1; }
  grep -q 'GPU 0: NVIDIA H100 80GB HBM3' <<< "$out" || { echo "node 2: $out"; return 1; }
  "$kubectl" delete pod a100 h100 --wait=false >/dev/null
}

# The pod's image sets NVIDIA_VISIBLE_DEVICES=all, as a CUDA image does: no allocation.
image_env_is_not_an_allocation() { sees no-limit nvshim-node1 0 0; }

one_gpu_not_all() { sees one-gpu nvshim-node1 1 1; }

exporter_names_the_pod() {
  local ip metrics
  pod gpu-holder nvshim-node1 1 nvidia "nvidia-smi -L; sleep 300"
  "$kubectl" wait --for=condition=Ready pod/gpu-holder --timeout=120s >/dev/null || { finished gpu-holder; return 1; }
  ip=$("$kubectl" -n nvshim get pods -l app.kubernetes.io/component=exporter \
    --field-selector spec.nodeName=nvshim-node1 -o jsonpath='{.items[0].status.podIP}')
  [ -n "$ip" ] || { "$kubectl" -n nvshim get pods -o wide; return 1; }
  "$kubectl" -n nvshim wait --for=condition=Ready pod -l app.kubernetes.io/component=exporter --timeout=120s >/dev/null
  for _ in $(seq 1 60); do
    metrics=$(curl -sf "http://$ip:9400/metrics") &&
      grep -q 'pod="gpu-holder"' <<< "$metrics" && break
    sleep 1
  done
  grep -E '^DCGM_FI_DEV_GPU_UTIL\{' <<< "$metrics" | head -n 5
  grep -qE '^DCGM_FI_DEV_[A-Z_]+\{[^}]*namespace="default"[^}]*pod="gpu-holder"[^}]*container="main"|^DCGM_FI_DEV_[A-Z_]+\{[^}]*container="main"[^}]*namespace="default"[^}]*pod="gpu-holder"' <<< "$metrics" ||
    { echo "no series names the GPU pod (namespace default, pod gpu-holder, container main)"; return 1; }
  [ "$(grep -E '^DCGM_FI_DEV_GPU_UTIL\{' <<< "$metrics" | grep -c 'pod="gpu-holder"')" = 1 ] ||
    { echo "not exactly one GPU's utilisation names the pod (it holds one GPU)"; return 1; }
  "$kubectl" delete pod gpu-holder --wait=false >/dev/null
}

gfd_labels_per_node() {
  local file=/etc/kubernetes/node-feature-discovery/features.d/nvshim labels
  "$kubectl" -n nvshim wait --for=condition=Ready pod -l app.kubernetes.io/component=labels --timeout=120s >/dev/null ||
    { "$kubectl" -n nvshim get pods -o wide; return 1; }
  for _ in $(seq 1 60); do node_exec 1 test -s "$file" && node_exec 2 test -s "$file" && break; sleep 1; done
  labels=$(node_exec 1 cat "$file") || return 1
  grep -qx 'nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB' <<< "$labels" && grep -qx 'nvidia.com/gpu.count=4' <<< "$labels" ||
    { echo "node 1's labels:"; echo "$labels"; return 1; }
  labels=$(node_exec 2 cat "$file") || return 1
  grep -qx 'nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3' <<< "$labels" && grep -qx 'nvidia.com/gpu.count=2' <<< "$labels" &&
    grep -qx 'nvidia.com/gpu.compute.major=9' <<< "$labels" || { echo "node 2's labels:"; echo "$labels"; return 1; }
}

# node_label NODE KEY: the value of the Node's label KEY (empty when it has none).
node_label() { "$kubectl" get node "$1" -o json | jq -r --arg k "$2" '.metadata.labels[$k] // ""'; }

# GFD's labels reach the Nodes through Node Feature Discovery: the chart's GFD writes each
# node's features.d file, NFD's worker publishes it as a NodeFeature, NFD's master labels the Node.
nfd_labels_on_nodes() {
  local p1= p2=
  for _ in $(seq 1 120); do
    p1=$(node_label nvshim-node1 nvidia.com/gpu.product) p2=$(node_label nvshim-node2 nvidia.com/gpu.product)
    [ "$p1" = NVIDIA-A100-SXM4-80GB ] && [ "$p2" = NVIDIA-H100-80GB-HBM3 ] && break
    sleep 1
  done
  echo "node 1: gpu.product=$p1 gpu.count=$(node_label nvshim-node1 nvidia.com/gpu.count) gpu.memory=$(node_label nvshim-node1 nvidia.com/gpu.memory)"
  echo "node 2: gpu.product=$p2 gpu.count=$(node_label nvshim-node2 nvidia.com/gpu.count) gpu.memory=$(node_label nvshim-node2 nvidia.com/gpu.memory)"
  [ "$p1" = NVIDIA-A100-SXM4-80GB ] && [ "$p2" = NVIDIA-H100-80GB-HBM3 ] ||
    { "$kubectl" -n node-feature-discovery get nodefeatures -o yaml | grep 'nvidia.com/gpu.product' ; return 1; }
  [ "$(node_label nvshim-node1 nvidia.com/gpu.count)" = "$node1_gpus" ] &&
    [ "$(node_label nvshim-node2 nvidia.com/gpu.count)" = "$node2_gpus" ] &&
    [ "$(node_label nvshim-node1 nvidia.com/gpu.memory)" = 81920 ] &&
    [ "$(node_label nvshim-node2 nvidia.com/gpu.memory)" = 81559 ] &&
    [ "$(node_label nvshim-node2 nvidia.com/gpu.compute.major)" = 9 ] || return 1
  # NFD's worker made them: its NodeFeature of node 1 carries the label.
  "$kubectl" -n node-feature-discovery get nodefeature nvshim-node1 -o json |
    jq -e '.spec.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"' >/dev/null ||
    { echo "NFD's worker's NodeFeature of nvshim-node1 lacks the GPU labels"; return 1; }
}

# affinity_pod NAME EXPRESSION: a pod with nvidia.com/gpu: 1 placed by the scheduler alone, on
# a node whose labels match EXPRESSION (a nodeAffinity matchExpressions item).
affinity_pod() {
  local required="{requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [$2]}]}}"
  pod_placed "$1" "affinity: {nodeAffinity: $required}" 1 nvidia "nvidia-smi -L"
}

# lands NAME EXPRESSION NODE MODEL: the pod of affinity_pod runs on NODE and sees a MODEL GPU.
lands() {
  local name=$1 expression=$2 node=$3 model=$4 out on
  affinity_pod "$name" "$expression"
  out=$(finished "$name") || { echo "$out"; return 1; }
  on=$("$kubectl" get pod "$name" -o jsonpath='{.spec.nodeName}')
  echo "$expression -> $on: $out"
  [ "$on" = "$node" ] || { echo "landed on $on, not $node"; return 1; }
  grep -q "^GPU 0: $model (UUID" <<< "$out" || { echo "not a $model"; return 1; }
  "$kubectl" delete pod "$name" --wait=false >/dev/null
}

# Pods placed by the GPU labels (model, memory, compute capability) land on the node that has them.
scheduled_by_labels() {
  lands by-model '{key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-H100-80GB-HBM3]}' \
    nvshim-node2 'NVIDIA H100 80GB HBM3' &&
    lands by-memory '{key: nvidia.com/gpu.memory, operator: Gt, values: ["81600"]}' \
      nvshim-node1 'NVIDIA A100-SXM4-80GB' &&
    lands by-compute '{key: nvidia.com/gpu.compute.major, operator: Gt, values: ["8"]}' \
      nvshim-node2 'NVIDIA H100 80GB HBM3' || return 1
  local reason=
  affinity_pod by-absent-model '{key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-B200]}'
  for _ in $(seq 1 60); do
    reason=$("$kubectl" get pod by-absent-model -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')
    [ -n "$reason" ] && break
    sleep 0.5
  done
  echo "a model no node has: $reason"
  grep -q "didn't match Pod's node affinity/selector" <<< "$reason" || return 1
  "$kubectl" delete pod by-absent-model --wait=false >/dev/null
}

# loop_pods LOG STOP: GPU pods (nvidia.com/gpu: 1, nvidia-smi -L) on node 1 one after another
# until the file STOP exists; one line per pod in LOG: "ok NAME" or "FAIL NAME: why".
loop_pods() {
  local log=$1 stop=$2 i=0 name out
  while [ ! -e "$stop" ]; do
    i=$((i + 1)) name=loop-$i
    pod "$name" nvshim-node1 1
    if out=$(finished "$name") && [ "$(count '^GPU [0-9]' "$out")" = 1 ]; then
      echo "ok $name" >> "$log"
    else
      echo "FAIL $name: $("$kubectl" get events --field-selector "involvedObject.name=$name" \
        -o jsonpath='{range .items[*]}{.reason}: {.message}; {end}' | cut -c1-600)" >> "$log"
    fi
    "$kubectl" delete pod "$name" --wait=false >/dev/null 2>&1
  done
}

# upgrade_under_load VALUE COMPONENT ADMISSION: `helm upgrade` setting VALUE to the images of
# other bytes (TAG-b) while GPU pods start one after another on node 1; waits for the rollout of
# COMPONENT's DaemonSet, its old pods gone (their SIGTERM handling done), and three more pods. Fails on any failed pod, except, with ADMISSION=counted, pods
# kubelet refused at admission while the device plugin was restarting (printed).
upgrade_under_load() {
  local value=$1 component=$2 admission=$3 log=$dir/upgrade-$1.log stop=$dir/upgrade-$1.stop
  local before after loop oks refused old
  before=$(node_exec 1 readlink /usr/local/nvidia/toolkit/current)
  old=$("$kubectl" -n nvshim get pods -l "app.kubernetes.io/component=$component" -o name)
  rm -f "$stop"
  : > "$log"
  loop_pods "$log" "$stop" &
  loop=$!
  for _ in $(seq 1 60); do [ "$(grep -c '^ok' "$log")" -ge 2 ] && break; sleep 1; done
  "$helm" upgrade nvshim deployments/helm/nvshim -n nvshim --reuse-values \
    --set "$value=$tag-b" --wait --timeout 300s >/dev/null &&
    "$kubectl" -n nvshim rollout status "daemonset/nvshim-$component" --timeout=240s >/dev/null &&
    "$kubectl" -n nvshim wait --for=delete $old --timeout=150s >/dev/null ||
    { touch "$stop"; wait "$loop"; "$kubectl" -n nvshim get pods -o wide; return 1; }
  oks=$(grep -c '^ok' "$log")
  for _ in $(seq 1 90); do [ "$(grep -c '^ok' "$log")" -ge $((oks + 3)) ] && break; sleep 1; done
  touch "$stop"
  wait "$loop"
  after=$(node_exec 1 readlink /usr/local/nvidia/toolkit/current)
  refused=$(grep -c '^FAIL .*UnexpectedAdmissionError: Allocate failed' "$log")
  echo "toolkit: $before -> $after; pods: $(grep -c '^ok' "$log") ok, $(grep -c '^FAIL' "$log") failed ($refused refused at admission)"
  if [ "$admission" = counted ]; then
    ! grep '^FAIL' "$log" | grep -v 'UnexpectedAdmissionError: Allocate failed' || return 1
  else
    ! grep '^FAIL' "$log" || return 1
  fi
  [ "$(grep -c '^ok' "$log")" -ge $((oks + 3)) ] || { echo "too few pods after the upgrade"; return 1; }
  [ "$component" != toolkit ] || [ "$before" != "$after" ] || { echo "the toolkit's version did not change"; return 1; }
}

# The toolkit's runtime swapped under running and starting GPU pods: none may fail.
toolkit_upgrade_under_load() { upgrade_under_load installer.image.tag toolkit strict; }

# The device plugin restarted: kubelet refuses admission while no plugin serves the resource
# (its devices unhealthy until the new plugin lists them, or the old plugin's Allocate gone
# with it: UnexpectedAdmissionError either way); nothing else may fail.
plugin_upgrade_under_load() { upgrade_under_load image.tag device-plugin counted; }

# strategy_upgrade VALUES...: `helm upgrade` with VALUES (--set …), then waits for the plugin's
# and the installer's rollouts and node 1's capacity.
strategy_upgrade() {
  "$helm" upgrade nvshim deployments/helm/nvshim -n nvshim --reuse-values "$@" --wait --timeout 300s >/dev/null &&
    "$kubectl" -n nvshim rollout status daemonset/nvshim-device-plugin --timeout=240s >/dev/null &&
    "$kubectl" -n nvshim rollout status daemonset/nvshim-toolkit --timeout=240s >/dev/null ||
    { "$kubectl" -n nvshim get pods -o wide; return 1; }
  capacity nvshim-node1 "$node1_gpus"
}

# What a pod's shell prints besides its GPUs: the env var and the plugin's volume mounts.
strategy_shell="nvidia-smi -L || echo no-nvidia-smi; ls /dev | grep -E '^nvidia[0-9]+\$' | sed 's/^/dev: /'; echo env: \$NVIDIA_VISIBLE_DEVICES; ls /var/run/nvidia-container-devices 2>/dev/null | sed 's/^/mount: /'"

# strategy_sees NAME CLASS: a pod with nvidia.com/gpu: 2 (runtime class CLASS, "" for runc)
# sees exactly two GPUs; prints what it saw.
strategy_sees() {
  local name=$1 class=$2 out
  pod "$name" nvshim-node1 2 "$class" "$strategy_shell"
  out=$(finished "$name") || { echo "$out"; return 1; }
  echo "$out"
  [ "$(count '^GPU [0-9]' "$out")" = 2 ] && [ "$(count '^dev: ' "$out")" = 2 ] &&
    [ "$(grep -o 'GPU-[0-9a-f-]*' <<< "$out" | sort -u | wc -l)" = 2 ] ||
    { echo "$name: not exactly two GPUs"; return 1; }
  "$kubectl" delete pod "$name" --wait=false >/dev/null
}

# deviceListStrategy=envvar with NVIDIA's toolkit defaults (the env var counts): the plugin's
# Allocate sets NVIDIA_VISIBLE_DEVICES to the two GPUs, over the image's "all".
envvar_strategy() {
  local out
  strategy_upgrade --set deviceListStrategy=envvar --set installer.acceptEnvvarWhenUnprivileged=true || return 1
  out=$(strategy_sees envvar-two nvidia) || { echo "$out"; return 1; }
  echo "$out"
  grep -qE '^env: GPU-[0-9a-f-]+,GPU-[0-9a-f-]+$' <<< "$out" || { echo "NVIDIA_VISIBLE_DEVICES is not the two UUIDs"; return 1; }
  ! grep -q '^mount: ' <<< "$out" || { echo "volume mounts under envvar"; return 1; }
}

# deviceListStrategy=cdi-cri with the chart's default (only an allocation counts): kubelet hands
# the plugin's CDI names to containerd 2, which resolves them from the plugin's spec in
# /var/run/cdi. The plugin sets NVIDIA_VISIBLE_DEVICES=void over the image's "all" (as NVIDIA's
# does with CDI strategies) and mounts nothing, so the two GPUs come from CDI alone: through the
# nvidia runtime class and through plain runc alike.
cdi_cri_strategy() {
  local out
  strategy_upgrade --set deviceListStrategy=cdi-cri --set installer.acceptEnvvarWhenUnprivileged=false || return 1
  node_exec 1 test -s /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json || { echo "no CDI spec on node 1"; return 1; }
  out=$(strategy_sees cdi-two nvidia) || { echo "$out"; return 1; }
  echo "$out"
  grep -qx 'env: void' <<< "$out" && ! grep -q '^mount: ' <<< "$out" ||
    { echo "the GPUs did not come from CDI alone"; return 1; }
  out=$(strategy_sees cdi-two-runc "") || { echo "$out"; return 1; }
  echo "$out"
  # No limit: still no GPU.
  sees cdi-no-limit nvshim-node1 0 0
}

# capacity NODE WANT: waits until NODE advertises WANT nvidia.com/gpu (90 s).
capacity() {
  local got=
  for _ in $(seq 1 180); do
    got=$("$kubectl" get node "$1" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')
    [ "$got" = "$2" ] && return 0
    sleep 0.5
  done
  echo "$1 advertises nvidia.com/gpu=\"$got\", not $2"
  return 1
}

time_slicing_multiplies_capacity() {
  cat > "$dir/time-slicing.yaml" <<'YAML'
config:
  map:
    default: |-
      version: v1
      sharing:
        timeSlicing:
          resources:
            - name: nvidia.com/gpu
              replicas: 4
YAML
  "$helm" upgrade nvshim deployments/helm/nvshim -n nvshim --reuse-values -f "$dir/time-slicing.yaml" \
    --wait --timeout 300s >/dev/null || return 1
  capacity nvshim-node1 $((node1_gpus * 4)) && capacity nvshim-node2 $((node2_gpus * 4)) || return 1
  # A replica is a share of one GPU: the pod sees one.
  sees shared-gpu nvshim-node1 1 1
}

too_many_gpus() {
  local reason=
  pod greedy nvshim-node1 $((node1_gpus + 1))
  for _ in $(seq 1 60); do
    reason=$("$kubectl" get pod greedy -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}')
    [ -n "$reason" ] && break
    sleep 0.5
  done
  echo "scheduler: $reason"
  [ "$("$kubectl" get pod greedy -o jsonpath='{.status.phase}')" = Pending ] || return 1
  grep -q 'Insufficient nvidia.com/gpu' <<< "$reason" || return 1
  "$kubectl" delete pod greedy --wait=false >/dev/null
}

helm_uninstall() {
  "$helm" uninstall nvshim -n nvshim --wait --timeout 180s || return 1
  # The DaemonSets' pods go after their owners: the installers undo the install on SIGTERM.
  "$kubectl" -n nvshim wait --for=delete pod --all --timeout=150s || { "$kubectl" -n nvshim get pods; return 1; }
  nodes_as_before
}

kustomize_install() {
  bash scripts/cluster/install.sh kustomize "$dir" "$tag" || return 1
  "$kubectl" -n nvshim wait --for=condition=complete job/nvshim-validation --timeout=120s ||
    { "$kubectl" -n nvshim logs job/nvshim-validation | tail -n 20; return 1; }
  two_gpus && image_env_is_not_an_allocation || return 1
  # The overlay's labeller publishes a NodeFeature itself (--use-node-feature-api); NFD's master
  # labels the Node from it.
  local nf=
  for _ in $(seq 1 90); do
    nf=$("$kubectl" -n nvshim get nodefeature nvidia-features-for-nvshim-node2 -o json 2>/dev/null |
      jq -r '.spec.labels["nvidia.com/gpu.product"] // ""')
    [ "$nf" = NVIDIA-H100-80GB-HBM3 ] && [ "$(node_label nvshim-node2 nvidia.com/gpu.product)" = "$nf" ] && break
    sleep 1
  done
  echo "NodeFeature nvshim/nvidia-features-for-nvshim-node2: gpu.product=$nf; Node: $(node_label nvshim-node2 nvidia.com/gpu.product)"
  [ "$nf" = NVIDIA-H100-80GB-HBM3 ] && [ "$(node_label nvshim-node2 nvidia.com/gpu.product)" = "$nf" ]
}

kustomize_delete() {
  "$kubectl" delete -f "$dir/kustomize/rendered.yaml" --wait=true --timeout=180s >/dev/null || return 1
  "$kubectl" wait --for=delete namespace/nvshim --timeout=150s || { "$kubectl" -n nvshim get pods; return 1; }
  nodes_as_before
}

# Each node's containerd config.toml byte-identical to before the install, no drop-in, no toolkit,
# no labels file (GFD's removes it on SIGTERM; NFD then drops the labels).
nodes_as_before() {
  local n
  for n in 1 2; do
    [ -f "$dir/config.toml.before-$n" ] || continue
    node_exec "$n" cat /etc/containerd/config.toml > "$dir/config.toml.after-$n"
    cmp "$dir/config.toml.before-$n" "$dir/config.toml.after-$n" ||
      { diff "$dir/config.toml.before-$n" "$dir/config.toml.after-$n"; return 1; }
    ! node_exec "$n" test -e /etc/containerd/conf.d/99-nvidia.toml || { echo "node $n: the drop-in is left"; return 1; }
    ! node_exec "$n" test -e /usr/local/nvidia/toolkit/nvidia-container-runtime ||
      { echo "node $n: the toolkit is left"; node_exec "$n" ls -la /usr/local/nvidia/toolkit; return 1; }
    ! node_exec "$n" test -e /etc/kubernetes/node-feature-discovery/features.d/nvshim ||
      { echo "node $n: the labels file is left"; return 1; }
  done
}
