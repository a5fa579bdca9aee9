#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The images of `make cluster`, built locally (no registry is reachable) as docker-archive
# tarballs in OUT, which every node imports into containerd's k8s.io namespace:
#   localhost/pause:3.10                      a static pause, the CRI sandbox image
#   localhost/busybox:latest                  busybox + glibc, which the injected nvidia-smi needs
#   localhost/nvshim/nvidia-device-plugin:TAG the plugin image (deployments/Dockerfile's files)
#   localhost/nvshim/container-toolkit:TAG    the installer image (container-toolkit.Dockerfile's)
#   the last two also as TAG-b: the same programs with other bytes (a marker after the ELF
#   image, which the loader ignores), for upgrades to a build that differs
#   localhost/nfd/node-feature-discovery:NFD  Node Feature Discovery's master, worker and gc as
#                                             built from the module proxy, as NFD's image has them
#                                             (/usr/bin, a non-root user)
# Usage: images.sh OUT BIN_DIR STATIC_DIR SIM TAG PEERS NFD
#   BIN_DIR: nvidia-device-plugin and nvshim; STATIC_DIR: the runtime and the hook as packages
#   ship them; SIM: a simulated node (its nvidia-smi and mock NVML fix what busybox's glibc needs);
#   PEERS: the peers' binaries (scripts/build-peers.sh); NFD: NFD's version (its image's tag).
set -euo pipefail
out=$1 bin=$2 static=$3 sim=$4 tag=$5 peers=$6 nfd=$7
mkdir -p "$out"
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# pack NAME ROOTFS RUN ENV_JSON [USER]: a one-layer docker-archive (ctr images import); RUN is
# the image config's "Entrypoint":[…] or "Cmd":[…] member, USER its "User" (default: root).
pack() {
  local name=$1 rootfs=$2 run=$3 env=$4 user=${5:-} dir
  dir=$(mktemp -d "$work/pack.XXXXXX")
  tar -C "$rootfs" --numeric-owner --owner=0 --group=0 -cf "$dir/layer.tar" .
  local digest
  digest=$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)
  [ -z "$user" ] || run+=",\"User\":\"$user\""
  printf '{"architecture":"amd64","os":"linux","config":{%s,"Env":%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$run" "$env" "$digest" > "$dir/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$name" > "$dir/manifest.json"
  local file=${name//[\/:]/_}.tar
  tar -C "$dir" -cf "$out/$file.tmp" manifest.json config.json layer.tar
  mv -f "$out/$file.tmp" "$out/$file"
  rm -rf "$dir"
}

# glibc ROOTFS BINARY...: the dynamic loader and every library the binaries link, at their paths.
glibc() {
  local root=$1; shift
  local lib
  for lib in $(ldd "$@" 2>/dev/null | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | sort -u); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  # /lib64 → usr/lib64 on usrmerged hosts: keep the loader's path the binaries ask for.
  mkdir -p "$root/lib64" "$root/etc"
  [ -e "$root/lib64/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
  : > "$root/etc/ld.so.conf"
}

base_env='["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]'

# pause: sleeps until SIGTERM/SIGINT (as PID 1 it has no default handlers).
mkdir -p "$work/pause"
printf '#include <signal.h>\n#include <unistd.h>\nstatic void bye(int s) { (void)s; _exit(0); }\nint main(void) { signal(SIGINT, bye); signal(SIGTERM, bye); for (;;) pause(); }\n' > "$work/pause.c"
gcc -static -O2 -o "$work/pause/pause" "$work/pause.c"
pack localhost/pause:3.10 "$work/pause" '"Entrypoint":["/pause"]' "$base_env"

# busybox + glibc: what a CUDA base image gives nvidia-smi; its env sets
# NVIDIA_VISIBLE_DEVICES=all, as every CUDA base image does.
bb=$work/busybox
mkdir -p "$bb/bin" "$bb/tmp" "$bb/etc"
cp "$(command -v busybox)" "$bb/bin/busybox"
for applet in $("$bb/bin/busybox" --list); do [ "$applet" = busybox ] || ln -sf busybox "$bb/bin/$applet"; done
mock=$(find "$sim/driver" -name 'libnvidia-ml.so.*.*' | head -n1)
glibc "$bb" "$sim/driver/usr/bin/nvidia-smi" "$mock"
echo 'root:x:0:0:root:/root:/bin/sh' > "$bb/etc/passwd"
pack localhost/busybox:latest "$bb" '"Cmd":["sh"]' \
  '["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","NVIDIA_VISIBLE_DEVICES=all"]'

# mark DIR: appends a marker to every file in DIR/usr/bin that is not a link.
mark() {
  local f
  for f in "$1"/usr/bin/*; do
    [ -L "$f" ] || printf '\nnvshim-cluster-b\n' >> "$f"
  done
}

for variant in "$tag" "$tag-b"; do
  # The device plugin image: nvidia-device-plugin, nvshim and gpu-feature-discovery (a copy of
  # nvshim), the env of deployments/Dockerfile.
  dp=$work/device-plugin
  mkdir -p "$dp/usr/bin" "$dp/tmp"
  install -m 0755 "$bin/nvidia-device-plugin" "$bin/nvshim" "$dp/usr/bin/"
  cp "$dp/usr/bin/nvshim" "$dp/usr/bin/gpu-feature-discovery"
  glibc "$dp" "$bin/nvidia-device-plugin" "$bin/nvshim"
  [ "$variant" = "$tag" ] || mark "$dp"
  pack "localhost/nvshim/nvidia-device-plugin:$variant" "$dp" '"Entrypoint":["/usr/bin/nvidia-device-plugin"]' \
    '["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","NVIDIA_VISIBLE_DEVICES=all","NVIDIA_DRIVER_CAPABILITIES=utility"]'

  # The installer image: the runtime, the hook and nvshim (which it copies to the host), and
  # chroot, which `--restart-mode systemd` runs systemctl through (Debian's, as the image's
  # debian:bookworm-slim base has it).
  tk=$work/toolkit
  mkdir -p "$tk/usr/bin" "$tk/usr/sbin" "$tk/tmp"
  install -m 0755 "$static/nvidia-container-runtime" "$static/nvidia-container-runtime-hook" "$tk/usr/bin/"
  install -m 0755 "$bin/nvshim" "$tk/usr/bin/"
  install -m 0755 "$(command -v chroot)" "$tk/usr/sbin/chroot"
  ln -sf nvshim "$tk/usr/bin/nvidia-ctk-installer"
  glibc "$tk" "$bin/nvshim" "$tk/usr/sbin/chroot"
  [ "$variant" = "$tag" ] || mark "$tk"
  pack "localhost/nvshim/container-toolkit:$variant" "$tk" '"Entrypoint":["/usr/bin/nvshim","install"]' "$base_env"
done
# Node Feature Discovery: its deployment runs the commands by name, as a non-root user
# (runAsNonRoot), with a read-only root.
nfdroot=$work/nfd
mkdir -p "$nfdroot/usr/bin"
install -m 0755 "$peers/nfd-master" "$peers/nfd-worker" "$peers/nfd-gc" "$nfdroot/usr/bin/"
glibc "$nfdroot" "$nfdroot"/usr/bin/*
pack "localhost/nfd/node-feature-discovery:$nfd" "$nfdroot" '"Cmd":["nfd-worker"]' "$base_env" 65534:65534
ls -la "$out"
