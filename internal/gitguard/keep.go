package gitguard

import (
	"strings"
)

// isKept reports whether a worktree-relative path (a directory may end
// in "/") is a keep path or below one.
func (g *Guard) isKept(p string) bool {
	p = strings.TrimSuffix(p, "/")
	for _, k := range g.keep {
		if p == k || strings.HasPrefix(p, k+"/") {
			return true
		}
	}
	return false
}

// excludePathspecs are the pathspecs that leave the keep paths out.
func (g *Guard) excludePathspecs() []string {
	var ps []string
	for _, k := range g.keep {
		ps = append(ps, ":(exclude,literal)"+k)
	}
	return ps
}

// hasKeptBelow reports whether a keep path lies strictly below rel.
func (g *Guard) hasKeptBelow(rel string) bool {
	for _, k := range g.keep {
		if strings.HasPrefix(k, rel+"/") {
			return true
		}
	}
	return false
}
