package gitguard

import (
	"context"
	"fmt"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// ValidBranch reports whether name is a branch name git accepts
// (refs/heads/<name> passes check-ref-format) and is not "HEAD" or an
// option.
func ValidBranch(name string) bool {
	return name != "" && name != "HEAD" && !strings.HasPrefix(name, "-") && gitformat.ValidRefName("refs/heads/"+name)
}

// PutOnBranch puts the worktree on branch: refs/heads/<branch> is created,
// or moved, at commit, and HEAD names it. commit is where HEAD already is
// (a worktree its restore just put back on the baseline, or registered
// there), so the index and the files do not change. The branch and HEAD
// are shim's from then on: the next restore saves what a harness did to
// that branch as it does for any trusted ref, and puts HEAD back on the
// pristine branch unless it is asked for this one again.
func (g *Guard) PutOnBranch(ctx context.Context, branch, commit string) error {
	if !ValidBranch(branch) {
		return errorf(CodeBadRequest, nil, "%q is not a branch name", branch)
	}
	if !gitformat.IsObjectName(commit) {
		return errorf(CodeBadRequest, nil, "%q is not a commit id", commit)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(false); err != nil {
		return err
	}
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return errorf(CodeWorktreeRefused, err, "open git dir")
	}
	defer unix.Close(gfd)
	ref := "refs/heads/" + branch
	msg := "shim: the announcement's branch at the baseline"
	in := fmt.Sprintf("option no-deref\nupdate %s %s\n", ref, commit)
	if _, err := g.git(ctx, gitOpts{stdin: strings.NewReader(in)}, "update-ref", "-m", msg, "--stdin"); err != nil {
		return errorf(CodeRestoreFailed, err, "put the worktree on branch %s", branch)
	}
	if err := writeFileAt(gfd, "HEAD", []byte("ref: "+ref+"\n"), 0o644, g.uid, g.gid, nil); err != nil {
		return errorf(CodeRestoreFailed, err, "point HEAD at %s", ref)
	}
	if err := g.trustRefs(map[string]string{ref: commit}); err != nil {
		return errorf(CodeRestoreFailed, err, "record %s as trusted", ref)
	}
	return nil
}
