//go:build tools

// Node Feature Discovery (master, worker, gc) for the live-cluster tests, built from the module
// proxy (scripts/build-peers.sh). NFD v0.20 needs Go 1.27: build-peers.sh builds this module
// alone with GOTOOLCHAIN=go1.27.3, which the go command takes from the module proxy.
package peers

import (
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-gc"
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-master"
	_ "sigs.k8s.io/node-feature-discovery/cmd/nfd-worker"
)
