#!/usr/bin/env bash
# One command on a fresh machine: install what is needed, build, create a simulated
# 4-GPU node, show what nvshim sees on it, and run a container asking for GPUs 0 and 2
# through nvidia-container-runtime and real runc.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "demo: run as root (the simulated node's /dev entries are made with mknod)" >&2
  exit 1
fi
need=()
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v ldconfig >/dev/null 2>&1 || need+=(libc-bin)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v busybox >/dev/null 2>&1 || need+=(busybox-static)
if [ "${#need[@]}" -gt 0 ]; then
  echo "demo: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

cargo build --workspace --release
bin=target/release
node=${NVSHIM_DEMO_DIR:-/tmp/nvshim-demo-node}
bundle=$node-bundle

echo "== building a simulated 4-GPU node in $node, and a container bundle in $bundle"
eval "$("$bin/nvshim-simnode" "$node" --gpus 4 --bundle "$bundle" \
  --env NVIDIA_VISIBLE_DEVICES=0,2 --cmd 'ls /dev | grep nvidia; nvidia-smi -L')"
flags=(--driver-root "$node/driver" --dev-root "$node" --proc-root "$node")

echo
echo "== nvshim info (NVML: the mock libnvidia-ml.so.1 found through the node's ld.so.cache)"
"$bin/nvshim" info --backend nvml "${flags[@]}"
echo
echo "== nvshim info --backend procfs (no library loaded)"
"$bin/nvshim" info --backend procfs "${flags[@]}"
echo
echo "== nvshim list --devices 0,2 --caps compute,utility: what a container asking for GPUs 0 and 2 gets"
"$bin/nvshim" list --devices 0,2 --caps compute,utility "${flags[@]}"
echo
echo "== nvidia-smi -L from the node (the fake nvidia-smi dlopens the mock NVML)"
LD_LIBRARY_PATH="$node/driver/usr/lib/x86_64-linux-gnu" "$node/driver/usr/bin/nvidia-smi" -L

echo
echo "== a container with NVIDIA_VISIBLE_DEVICES=0,2 through nvidia-container-runtime and runc"
echo "   (inside: ls /dev | grep nvidia; nvidia-smi -L)"
config=$node/nvidia-container-runtime.toml
cat > "$config" <<EOF
[nvidia-container-cli]
root = "$node/driver"
dev-root = "$node"

[nvidia-container-runtime]
runtimes = ["runc"]

[nvshim]
proc-root = "$node"
EOF
NVIDIA_CTK_CONFIG_FILE_PATH=$config "$bin/nvidia-container-runtime" --root "$node/runc" \
  run --bundle "$bundle" "nvshim-demo-$$"

# On a host with a real NVIDIA driver, the same bundle through the runtime's defaults
# (driver root /, NVML and procfs of the host): the real nvidia-smi and real GPUs.
if [ -e /proc/driver/nvidia/version ]; then
  echo
  echo "== the same container on this host's real driver (driver root /)"
  real=$node/real-driver.toml
  printf '[nvidia-container-runtime]\nruntimes = ["runc"]\n' > "$real"
  NVIDIA_CTK_CONFIG_FILE_PATH=$real "$bin/nvidia-container-runtime" --root "$node/runc" \
    run --bundle "$bundle" "nvshim-demo-real-$$"
fi
