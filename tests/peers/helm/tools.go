//go:build tools

// helm for the live-cluster tests, built from the module proxy (build.sh).
package peers

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
