#!/usr/bin/env bash
# One command on a fresh machine: install what is needed, build, create a simulated
# 4-GPU node, and show what nvshim sees on it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "demo: run as root (the simulated node's /dev entries are made with mknod)" >&2
  exit 1
fi
if ! command -v cc >/dev/null 2>&1 || ! command -v ldconfig >/dev/null 2>&1; then
  echo "demo: installing gcc and libc6-dev (the node's library stubs are real ELF files)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev libc-bin
fi

cargo build --workspace --release
bin=target/release
node=${NVSHIM_DEMO_DIR:-/tmp/nvshim-demo-node}

echo "== building a simulated 4-GPU node in $node"
eval "$("$bin/nvshim-simnode" "$node" --gpus 4)"
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
