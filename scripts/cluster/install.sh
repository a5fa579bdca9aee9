#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs nvshim on the cluster of `make cluster` and waits until every node has the toolkit
# (its ready file) and advertises its GPUs (nvidia.com/gpu capacity = the simulated node's
# GPUs): install.sh helm|kustomize|none DIR TAG
#   helm       `helm install nvshim deployments/helm/nvshim` (Helm v4), release namespace nvshim,
#              images from the nodes' local store (pullPolicy Never), the driver at
#              /run/nvidia/driver (where the nodes have it, as with a driver container)
#   kustomize  `kubectl apply -k` of the node runtime's overlay (containerd or crio), with the
#              same images and driver root
#   none       nothing
# Extra `helm install` arguments: NVSHIM_HELM_ARGS (split on spaces).
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=$1 dir=$2 tag=$3
. "$dir/cluster.env"
peers=${NVSHIM_PEERS_CACHE:-/var/cache/nvshim-ci/peers}/bin
export KUBECONFIG=$dir/admin.kubeconfig
kubectl=$peers/kubectl
plugin_image=localhost/nvshim/nvidia-device-plugin
toolkit_image=localhost/nvshim/container-toolkit

case $mode in
  none) exit 0 ;;
  helm)
    # shellcheck disable=SC2086
    "$peers/helm" install nvshim deployments/helm/nvshim --namespace nvshim --create-namespace \
      --set image.repository=$plugin_image --set image.tag="$tag" --set image.pullPolicy=Never \
      --set installer.image.repository=$toolkit_image --set installer.image.tag="$tag" \
      --set installer.image.pullPolicy=Never --set nvidiaDriverRoot=/run/nvidia/driver \
      ${NVSHIM_HELM_ARGS:-}
    ;;
  kustomize)
    k=$dir/kustomize
    rm -rf "$k" && mkdir -p "$k"
    cat > "$k/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$k" "$PWD/deployments/kustomize/overlays/${runtime:-containerd}")
images:
  - name: ghcr.io/nvshim/nvidia-device-plugin
    newName: $plugin_image
    newTag: "$tag"
  - name: ghcr.io/nvshim/container-toolkit
    newName: $toolkit_image
    newTag: "$tag"
patches:
  - target: {kind: DaemonSet, name: nvshim-installer}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --driver-root=/run/nvidia/driver
YAML
    "$kubectl" kustomize --load-restrictor LoadRestrictionsNone "$k" > "$k/rendered.yaml"
    # The images are the nodes' own: never pulled.
    sed -i 's/imagePullPolicy: IfNotPresent/imagePullPolicy: Never/' "$k/rendered.yaml"
    "$kubectl" apply -f "$k/rendered.yaml"
    ;;
  *) echo "install: unknown mode \"$mode\" (valid: helm, kustomize, none)" >&2; exit 1 ;;
esac

# Every node's toolkit installed: the installer's ready file (a node's capacity alone can be
# left from an earlier install).
for n in $(seq 1 "$nodes"); do
  for _ in $(seq 1 300); do
    nsenter -t "$(cat "$dir/node$n/init.pid")" -m -- test -e /run/nvidia/validations/toolkit-ready && break
    sleep 0.5
  done
  nsenter -t "$(cat "$dir/node$n/init.pid")" -m -- test -e /run/nvidia/validations/toolkit-ready || {
    "$kubectl" get pods -A -o wide >&2 || true
    echo "install: no toolkit-ready file on nvshim-node$n after 150 s" >&2
    exit 1
  }
done
# Every node's capacity: the node's GPUs (node 1: 4, node 2: 2).
for n in $(seq 1 "$nodes"); do
  want=4
  [ "$n" = 2 ] && want=2
  got=
  for _ in $(seq 1 300); do
    got=$("$kubectl" get node "nvshim-node$n" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')
    [ "$got" = "$want" ] && break
    sleep 0.5
  done
  if [ "$got" != "$want" ]; then
    "$kubectl" get pods -A -o wide >&2 || true
    echo "install: nvshim-node$n advertises nvidia.com/gpu=\"$got\", not $want, after 150 s" >&2
    exit 1
  fi
done
echo "install ($mode): every node advertises its GPUs"
