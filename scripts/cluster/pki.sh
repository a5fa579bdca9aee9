#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The certificates and kubeconfigs of `make cluster`, made locally with openssl:
#   pki.sh DIR APISERVER_IP "NODE..."
# DIR/pki: a CA; the API server's serving cert (the bridge address, the service IP
# 10.96.0.1, localhost, the kubernetes.default names); the service-account key pair; client
# certs for the admin (system:masters), the controller manager, the scheduler, the API server's
# calls to kubelets and each node's kubelet (system:node:NAME in system:nodes, which the Node
# authorizer and NodeRestriction expect). DIR/*.kubeconfig: one per client.
# Existing files are kept, so a restarted cluster keeps its identity.
set -euo pipefail
dir=$1 ip=$2 nodes=$3
pki=$dir/pki
mkdir -p "$pki"
cd "$pki"

if [ ! -f ca.key ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 \
    -subj "/CN=nvshim-cluster-ca" 2>/dev/null
fi
[ -f sa.key ] || { openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null; }

# cert NAME SUBJECT [SAN]: a key and a cert signed by the CA.
cert() {
  local name=$1 subj=$2 san=${3:-}
  [ -f "$name.crt" ] && return
  openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null
  local ext
  ext=$(mktemp)
  if [ -n "$san" ]; then
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > "$ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' > "$ext"
  fi
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" \
    -days 3650 -extfile "$ext" 2>/dev/null
  rm -f "$name.csr" "$ext"
}

cert apiserver "/CN=kube-apiserver" \
  "IP:$ip,IP:10.96.0.1,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert admin "/O=system:masters/CN=nvshim-admin"
cert controller-manager "/CN=system:kube-controller-manager"
cert scheduler "/CN=system:kube-scheduler"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
for node in $nodes; do
  cert "kubelet-$node" "/O=system:nodes/CN=system:node:$node"
done

# kubeconfig FILE CERT: a kubeconfig for the API server at https://IP:6443 with the embedded
# CA and the client cert CERT.
kubeconfig() {
  local file=$1 name=$2
  cat > "$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: nvshim
    cluster:
      server: https://$ip:6443
      certificate-authority-data: $(base64 -w0 ca.crt)
users:
  - name: $name
    user:
      client-certificate-data: $(base64 -w0 "$name.crt")
      client-key-data: $(base64 -w0 "$name.key")
contexts:
  - name: nvshim
    context: {cluster: nvshim, user: $name}
current-context: nvshim
EOF
  mv -f "$file.tmp" "$file"
}
kubeconfig "$dir/admin.kubeconfig" admin
kubeconfig "$dir/controller-manager.kubeconfig" controller-manager
kubeconfig "$dir/scheduler.kubeconfig" scheduler
for node in $nodes; do
  kubeconfig "$dir/kubelet-$node.kubeconfig" "kubelet-$node"
done
chmod 600 "$dir"/*.kubeconfig ./*.key
