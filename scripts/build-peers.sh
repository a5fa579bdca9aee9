#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the live cluster's peers (tests/peers/versions.env) from the Go module proxy into a
# cache kept between runs:  scripts/build-peers.sh [CACHE]   (default /var/cache/nvshim-ci/peers)
#
#   CACHE/bin/     kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl
#                  etcd containerd containerd-shim-runc-v2 ctr runc helm
#                  nfd-master nfd-worker nfd-gc crio pinns
#   CACHE/gomod/   the module cache (GOMODCACHE), CACHE/gocache/ Go's build cache (GOCACHE)
#   CACHE/stamps/  one file per peer: its version and its go.sum's hash
#
# A peer is built only when its stamp differs from what tests/peers/ pins, so a warm cache
# costs a few hashes. The five Kubernetes commands build in one `go build` (their shared
# packages compile once). Every module comes through go.sum, checked by the go command.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${1:-${NVSHIM_PEERS_CACHE:-/var/cache/nvshim-ci/peers}}
peers=$PWD/tests/peers
mkdir -p "$cache/bin" "$cache/gomod" "$cache/gocache" "$cache/stamps"
export GOMODCACHE=$cache/gomod GOCACHE=$cache/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local

command -v go >/dev/null || { echo "build-peers: go is not on PATH (Go 1.26 builds the peers)" >&2; exit 1; }
# runc's nsenter and seccomp and CRI-O's pinns are C: gcc and libseccomp's headers.
for tool in gcc pkg-config; do
  command -v "$tool" >/dev/null || { echo "build-peers: $tool is not on PATH (runc's cgo build)" >&2; exit 1; }
done
pkg-config --exists libseccomp || { echo "build-peers: libseccomp-dev is missing (runc's seccomp)" >&2; exit 1; }

# NAME=VERSION from versions.env.
declare -A version
while IFS='=' read -r name ver; do
  [[ $name =~ ^[A-Z]+$ ]] && version[$name]=$ver
done < "$peers/versions.env"

# build NAME DIR MODULE 'BINARIES' LDFLAGS ARGS...: BINARIES are the cache's names, each NAME
# or NAME=BUILT where go build names the binary BUILT (a module path ending in /vN); ARGS are
# go build's other flags and the packages. The stamp covers the version, go.sum, Go's
# version and this recipe.
build() {
  local name=$1 dir=$2 module=$3 bins=$4 ldflags="-s -w $5"; shift 5
  local want=${version[$name]:?"versions.env has no $name"}
  local pinned
  pinned=$(awk -v m="$module" '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "$peers/$dir/go.mod" | head -n1)
  if [ "$pinned" != "$want" ]; then
    echo "build-peers: tests/peers/$dir/go.mod pins $module $pinned, versions.env says $name=$want" >&2
    exit 1
  fi
  local stamp
  stamp="$want $(sha256sum "$peers/$dir/go.sum" | cut -d' ' -f1) $(cd "$peers/$dir" && go env GOVERSION) $(echo "$bins $ldflags $*" | sha256sum | cut -c1-16)"
  local missing=0 b
  for b in $bins; do [ -x "$cache/bin/${b%%=*}" ] || missing=1; done
  if [ "$missing" = 0 ] && [ "$(cat "$cache/stamps/$name" 2>/dev/null)" = "$stamp" ]; then
    echo "build-peers: $name $want: cached"
    return
  fi
  echo "build-peers: $name $want: building $bins"
  local start=$SECONDS out
  out=$(mktemp -d "$cache/build.XXXXXX")
  (cd "$peers/$dir" && go build -trimpath -ldflags="$ldflags" -o "$out/" "$@")
  for b in $bins; do
    local built=${b#*=}
    [ -x "$out/$built" ] || { echo "build-peers: $name built no $built" >&2; exit 1; }
    mv -f "$out/$built" "$cache/bin/${b%%=*}"
  done
  rmdir "$out"
  printf '%s\n' "$stamp" > "$cache/stamps/$name"
  echo "build-peers: $name $want: built in $((SECONDS - start)) s"
}

k8s=k8s.io/kubernetes/cmd
# The version the commands report (kubectl version, the Node's kubeletVersion, Helm's
# kubeVersion checks), as Kubernetes' release build stamps it.
kv=${version[KUBERNETES]}
minor=${kv#v1.}
minor=${minor%%.*}
kver=
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kver+=" -X $pkg.gitVersion=$kv -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
build KUBERNETES kubernetes k8s.io/kubernetes \
  "kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl" "$kver" \
  $k8s/kube-apiserver $k8s/kube-controller-manager $k8s/kube-scheduler $k8s/kubelet $k8s/kubectl
# etcd's server module is the etcd command (its main.go).
build ETCD etcd go.etcd.io/etcd/server/v3 "etcd=server" "" go.etcd.io/etcd/server/v3
# containerd without the btrfs snapshotter (its cgo needs btrfs headers; nodes use overlayfs).
ctrd=github.com/containerd/containerd/v2
build CONTAINERD containerd $ctrd "containerd containerd-shim-runc-v2 ctr" \
  "-X $ctrd/version.Version=${version[CONTAINERD]#v}" \
  -tags no_btrfs $ctrd/cmd/containerd $ctrd/cmd/containerd-shim-runc-v2 $ctrd/cmd/ctr
build RUNC runc github.com/opencontainers/runc "runc" "-X main.version=${version[RUNC]#v}" \
  -tags seccomp github.com/opencontainers/runc
build HELM helm helm.sh/helm/v4 "helm" "-X helm.sh/helm/v4/internal/version.version=${version[HELM]}" \
  helm.sh/helm/v4/cmd/helm
# Node Feature Discovery v0.20 needs Go 1.27: this module alone builds with the toolchain the
# go command takes from the module proxy (golang.org/toolchain, kept in the module cache).
nfd=sigs.k8s.io/node-feature-discovery
GOTOOLCHAIN=go1.27.3 build NFD nfd $nfd "nfd-master nfd-worker nfd-gc" \
  "-X $nfd/pkg/version.version=${version[NFD]}" \
  $nfd/cmd/nfd-master $nfd/cmd/nfd-worker $nfd/cmd/nfd-gc
# CRI-O with the build tags its Makefile picks on a host without btrfs, gpgme or ostree headers
# (signatures by the pure-Go OpenPGP), and pinns, its namespace pinner, from the module's C source.
crio=github.com/cri-o/cri-o
build CRIO crio $crio "crio" "" \
  -tags "containers_image_ostree_stub exclude_graphdriver_btrfs containers_image_openpgp seccomp selinux" \
  $crio/cmd/crio
pinns_src=$GOMODCACHE/$crio@${version[CRIO]}/pinns/src
pinns_stamp="${version[CRIO]} $(cat "$pinns_src"/*.c "$pinns_src"/*.h | sha256sum | cut -c1-16) $(gcc -dumpfullversion)"
if [ -x "$cache/bin/pinns" ] && [ "$(cat "$cache/stamps/pinns" 2>/dev/null)" = "$pinns_stamp" ]; then
  echo "build-peers: pinns ${version[CRIO]}: cached"
else
  # As pinns/Makefile builds it: C99, static.
  gcc -std=c99 -Os -Wall -Wextra -static -o "$cache/bin/pinns.tmp" "$pinns_src"/*.c
  mv -f "$cache/bin/pinns.tmp" "$cache/bin/pinns"
  printf '%s\n' "$pinns_stamp" > "$cache/stamps/pinns"
  echo "build-peers: pinns ${version[CRIO]}: built"
fi
