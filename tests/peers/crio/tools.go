//go:build tools

// CRI-O for the live-cluster tests, built from the module proxy (scripts/build-peers.sh), with
// pinns compiled from the same module's C source; conmon is Debian's.
package peers

import (
	_ "github.com/cri-o/cri-o/cmd/crio"
)
