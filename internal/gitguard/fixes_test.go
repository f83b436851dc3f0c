package gitguard

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestGitStderrHasNoHomeWarning: git runs as the worktree owner, who cannot
// read anything in StateDir; its HOME must not point there, or every call
// starts its stderr with "unable to access .../.config/git/ignore" and the
// real error of a failed call is pushed out of the message.
func TestGitStderrHasNoHomeWarning(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	f := newFixture(t)
	chownR(t, f.wt, 65534)
	g := f.guard(t, nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(true); err != nil {
		t.Fatal(err)
	}
	if !g.asOwner {
		t.Fatal("git does not run as the owner; the test proves nothing")
	}
	_, err := g.git(ctx, gitOpts{}, "ls-files", "--others", "--exclude-standard", "--error-unmatch", "--", "does-not-exist")
	var ge *GitError
	if !errors.As(err, &ge) {
		t.Fatalf("want a GitError, got %v", err)
	}
	if strings.Contains(ge.Stderr, "unable to access") || strings.Contains(ge.Stderr, "Permission denied") {
		t.Errorf("git's stderr carries a HOME warning: %q", ge.Stderr)
	}
	if !strings.HasPrefix(ge.Stderr, "error:") {
		t.Errorf("git's stderr does not start with the error: %q", ge.Stderr)
	}
}
