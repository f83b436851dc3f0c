package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
)

// pathKey names a worktree's private state dir: readable, and unique.
func pathKey(p string) string {
	p = filepath.Clean(p)
	sum := sha256.Sum256([]byte(p))
	base := strings.Trim(strings.ReplaceAll(p, "/", "-"), "-")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	return base + "-" + hex.EncodeToString(sum[:4])
}
