//go:build tools

// runc for the live-cluster tests, built from the module proxy (build.sh).
package peers

import (
	_ "github.com/opencontainers/runc"
)
