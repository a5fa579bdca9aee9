#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CRI-O cases of `make test-cluster` (sourced by tests/cluster/run.sh after cases.sh, on a
# one-node cluster with CLUSTER_RUNTIME=crio: CRI-O 1.34, runc, Debian's conmon). The installer
# restarts CRI-O through the node's `systemctl restart crio` (CRI-O takes no new runtime on a
# signal), so each install and undo must show a new CRI-O.

crio_starts() { grep -c 'starting crio' "$dir/node1/crio.log"; }

# crio_restarted BEFORE: CRI-O started again since it had started BEFORE times.
crio_restarted() {
  local now
  now=$(crio_starts)
  [ "$now" -gt "$1" ] || { echo "CRI-O was not restarted (started $now time(s), as before)"; return 1; }
}

crio_helm_install() {
  local starts dropin
  node_exec 1 cat /etc/crio/crio.conf > "$dir/crio.conf.before" || return 1
  starts=$(crio_starts)
  NVSHIM_HELM_ARGS="--set installer.runtime=crio --set exporter.enabled=true" \
    bash scripts/cluster/install.sh helm "$dir" "$tag" || return 1
  dropin=$(node_exec 1 cat /etc/crio/crio.conf.d/99-nvidia.toml) || { echo "no drop-in"; return 1; }
  echo "$dropin"
  grep -q 'crio\.runtime\.runtimes\.nvidia' <<< "$dropin" &&
    grep -q 'runtime_path = "/usr/local/nvidia/toolkit/nvidia-container-runtime"' <<< "$dropin" ||
    { echo "the drop-in registers no nvidia runtime running the toolkit's"; return 1; }
  # A copy of runc's handler: its monitor and state root carry over.
  grep -q 'monitor_path = "/usr/bin/conmon"' <<< "$dropin" || { echo "runc's handler settings did not carry over"; return 1; }
  crio_restarted "$starts" || return 1
  node_exec 1 test -f /run/nvidia/validations/toolkit-ready || { echo "no ready file"; return 1; }
  validation_job
}

crio_gpus() {
  sees crio-two nvshim-node1 2 2 && sees crio-no-limit nvshim-node1 0 0 && sees crio-one nvshim-node1 1 1
}

# cdi-cri on CRI-O: CRI-O resolves the plugin's CDI names itself (CDI is always on in CRI-O).
# Then with the env var accepted (NVIDIA's toolkit default): CRI-O orders the image's
# NVIDIA_VISIBLE_DEVICES=all after the CDI spec's "void", so without the plugin's own "void"
# the runtime class's pod got every GPU; it must still see exactly its two.
crio_cdi_cri() {
  strategy_upgrade --set deviceListStrategy=cdi-cri || return 1
  local out
  out=$(strategy_sees crio-cdi-two nvidia) || { echo "$out"; return 1; }
  echo "$out"
  grep -qx 'env: void' <<< "$out" && ! grep -q '^mount: ' <<< "$out" ||
    { echo "the GPUs did not come from CDI alone"; return 1; }
  strategy_sees crio-cdi-two-runc "" || return 1
  strategy_upgrade --set installer.acceptEnvvarWhenUnprivileged=true || return 1
  strategy_sees crio-cdi-two-env-accepted nvidia
}

# The node's CRI-O config as before the install, no drop-in, no hook, no toolkit.
crio_as_before() {
  node_exec 1 cat /etc/crio/crio.conf > "$dir/crio.conf.after"
  cmp "$dir/crio.conf.before" "$dir/crio.conf.after" || { diff "$dir/crio.conf.before" "$dir/crio.conf.after"; return 1; }
  ! node_exec 1 test -e /etc/crio/crio.conf.d/99-nvidia.toml || { echo "the drop-in is left"; return 1; }
  ! node_exec 1 test -e /usr/share/containers/oci/hooks.d/oci-nvidia-hook.json || { echo "the hook file is left"; return 1; }
  ! node_exec 1 test -e /usr/local/nvidia/toolkit/nvidia-container-runtime || { echo "the toolkit is left"; return 1; }
}

crio_helm_uninstall() {
  local starts
  starts=$(crio_starts)
  "$helm" uninstall nvshim -n nvshim --wait --timeout 180s >/dev/null || return 1
  "$kubectl" -n nvshim wait --for=delete pod --all --timeout=150s >/dev/null || { "$kubectl" -n nvshim get pods; return 1; }
  crio_as_before && crio_restarted "$starts"
}

# installer.crioConfigMode=hook: the OCI hook in CRI-O's hooks.d instead of a runtime; no
# RuntimeClass, every container runs the hook; only an allocation gives GPUs. The installer
# restarts CRI-O to load the hook, and a container CRI-O is creating at that moment is lost
# (its pod stays Init "running" with no process: seen here when the plugin's and the
# validation's pods, which name no runtime class in this mode, started with the installer).
# So, as docs/helm.md says for this mode: the toolkit first, then the rest.
crio_hook_install() {
  local starts hook chart_args
  starts=$(crio_starts)
  chart_args=(--set image.repository=localhost/nvshim/nvidia-device-plugin --set image.tag="$tag"
    --set image.pullPolicy=Never --set installer.image.repository=localhost/nvshim/container-toolkit
    --set installer.image.tag="$tag" --set installer.image.pullPolicy=Never
    --set nvidiaDriverRoot=/run/nvidia/driver --set installer.runtime=crio
    --set installer.crioConfigMode=hook)
  "$helm" install nvshim deployments/helm/nvshim -n nvshim --create-namespace "${chart_args[@]}" \
    --set devicePlugin.enabled=false --set validation.enabled=false --wait --timeout 300s >/dev/null || return 1
  # The installer's own word that it is done (Helm's wait can pass a DaemonSet too early).
  for _ in $(seq 1 240); do node_exec 1 test -e /run/nvidia/validations/toolkit-ready && break; sleep 0.5; done
  hook=$(node_exec 1 cat /usr/share/containers/oci/hooks.d/oci-nvidia-hook.json) || { echo "no hook file"; return 1; }
  jq -e '.hook.path == "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook" and .stages == ["prestart"]' \
    <<< "$hook" >/dev/null || { echo "$hook"; return 1; }
  ! node_exec 1 test -e /etc/crio/crio.conf.d/99-nvidia.toml || { echo "hook mode wrote a drop-in"; return 1; }
  ! "$kubectl" get runtimeclass nvidia >/dev/null 2>&1 || { echo "hook mode made a RuntimeClass"; return 1; }
  crio_restarted "$starts" || return 1
  "$helm" upgrade nvshim deployments/helm/nvshim -n nvshim --reuse-values \
    --set devicePlugin.enabled=true --set validation.enabled=true --wait --timeout 300s >/dev/null || return 1
  capacity nvshim-node1 "$node1_gpus" || return 1
  local job
  job=$("$kubectl" -n nvshim get jobs -o name | head -n1)
  "$kubectl" -n nvshim wait --for=condition=complete "$job" --timeout=120s ||
    { "$kubectl" -n nvshim logs "$job" | tail -n 20; return 1; }
  sees hook-two nvshim-node1 2 2 "" && sees hook-no-limit nvshim-node1 0 0 ""
}

crio_kustomize_install() {
  local starts
  starts=$(crio_starts)
  bash scripts/cluster/install.sh kustomize "$dir" "$tag" || return 1
  node_exec 1 test -e /etc/crio/crio.conf.d/99-nvidia.toml || { echo "no drop-in"; return 1; }
  crio_restarted "$starts" || return 1
  "$kubectl" -n nvshim wait --for=condition=complete job/nvshim-validation --timeout=120s ||
    { "$kubectl" -n nvshim logs job/nvshim-validation | tail -n 20; return 1; }
  two_gpus && image_env_is_not_an_allocation
}

crio_kustomize_delete() {
  local starts
  starts=$(crio_starts)
  "$kubectl" delete -f "$dir/kustomize/rendered.yaml" --wait=true --timeout=180s >/dev/null || return 1
  "$kubectl" wait --for=delete namespace/nvshim --timeout=150s || { "$kubectl" -n nvshim get pods; return 1; }
  crio_as_before && crio_restarted "$starts"
}
