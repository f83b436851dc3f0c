package runtime

import (
	"path/filepath"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// validGenerations refuses a generation (or if_current) above
// api.MaxGeneration, and the worktree "/", before anything is fenced: a
// supervisor's typo must not become a token no generation can pass.
func validGenerations(n uint64, ifCurrent *uint64, worktree string) error {
	if n > api.MaxGeneration {
		return errs.New(api.CodeBadRequest, "generation %d is above %d (2^53-1, the largest every JSON client holds exactly)", n, uint64(api.MaxGeneration))
	}
	if ifCurrent != nil && *ifCurrent > api.MaxGeneration {
		return errs.New(api.CodeBadRequest, "if_current %d is above %d (2^53-1)", *ifCurrent, uint64(api.MaxGeneration))
	}
	if worktree != "" && filepath.Clean(worktree) == "/" {
		return errs.New(api.CodeBadRequest, "worktree must not be /")
	}
	return nil
}
