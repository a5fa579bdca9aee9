//go:build tools

// etcd for the live-cluster tests, built from the module proxy (build.sh).
package peers

import (
	_ "go.etcd.io/etcd/server/v3"
)
