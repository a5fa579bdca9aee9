#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Deploys Node Feature Discovery on the cluster of `make cluster` as NFD's own documentation
# does (`kubectl apply -k` of its default overlay: nfd-master, the nfd-worker DaemonSet, nfd-gc,
# the NodeFeature CRDs, RBAC), from the module of the version tests/peers/versions.env pins, with
# the image scripts/cluster/images.sh built from the same source (no registry is reachable).
# The worker turns each node's features.d files (our chart's GFD) into a NodeFeature object, and
# the master labels the Node from NodeFeature objects (also the ones `nvshim labels
# --use-node-feature-api` publishes).   Usage: nfd.sh DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$1
cache=${NVSHIM_PEERS_CACHE:-/var/cache/nvshim-ci/peers}
kubectl=$cache/bin/kubectl
export KUBECONFIG=$dir/admin.kubeconfig
version=$(awk -F= '$1 == "NFD" {print $2}' tests/peers/versions.env)
module=$cache/gomod/sigs.k8s.io/node-feature-discovery@$version
[ -d "$module/deployment/overlays/default" ] ||
  { echo "nfd: $module/deployment is missing (scripts/build-peers.sh downloads NFD $version)" >&2; exit 1; }

k=$dir/nfd
rm -rf "$k" && mkdir -p "$k"
cat > "$k/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$k" "$module/deployment/overlays/default")
images:
  - name: registry.k8s.io/nfd/node-feature-discovery
    newName: localhost/nfd/node-feature-discovery
    newTag: "$version"
YAML
"$kubectl" kustomize --load-restrictor LoadRestrictionsNone "$k" > "$k/rendered.yaml"
sed -i 's/imagePullPolicy: IfNotPresent/imagePullPolicy: Never/' "$k/rendered.yaml"
"$kubectl" apply -f "$k/rendered.yaml" > "$k/apply.log"
"$kubectl" -n node-feature-discovery rollout status deployment/nfd-master --timeout=120s > /dev/null
"$kubectl" -n node-feature-discovery rollout status daemonset/nfd-worker --timeout=120s > /dev/null
echo "nfd: Node Feature Discovery $version runs (namespace node-feature-discovery)"
