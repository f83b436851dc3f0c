package gitguard

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// testGitTimeout is the GitTimeout of the deadline tests; each bounded call
// must return well within testReturnBound.
const (
	testGitTimeout  = 2 * time.Second
	testReturnBound = 15 * time.Second
)

// timed runs fn and fails the test if it took longer than testReturnBound.
func timed(t *testing.T, what string, fn func() error) error {
	t.Helper()
	start := time.Now()
	err := fn()
	if d := time.Since(start); d > testReturnBound {
		t.Errorf("%s took %s, want < %s (GitTimeout %s)", what, d, testReturnBound, testGitTimeout)
	}
	return err
}

// assertTimedOut checks err is the per-git deadline: it wraps
// context.DeadlineExceeded and says it timed out.
func assertTimedOut(t *testing.T, what string, err error, wantCode string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want a timeout", what)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "timed out after "+testGitTimeout.String()) {
		t.Errorf("%s: %v, want a timed-out error wrapping context.DeadlineExceeded", what, err)
	}
	if wantCode != "" && code(err) != wantCode {
		t.Errorf("%s: code %q, want %s", what, code(err), wantCode)
	}
}

// assertNoStuckGoroutine fails if any goroutine is still inside gitguard
// (a git wait, a parallel step, a read) after the calls returned. The
// runner's watcher has ended before Run returns, so nothing of ours may
// be left.
func assertNoStuckGoroutine(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		for _, mark := range []string{"gitguard.(*Guard)", "gitguard.waitOrKill", "gitguard.parallel", "gitguard.ExecRunner", "gitguard.readFileAt"} {
			if strings.Contains(g, mark) {
				t.Errorf("a goroutine is still in gitguard:\n%s", g)
				break
			}
		}
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	_ = os.Remove(path)
	must(t, syscall.Mkfifo(path, 0o644))
}

// TestFIFOsInTheGitDirCannotBlock: FIFOs planted where git or shim read.
// shim's own reads never block on one (O_NONBLOCK, regular files only); a
// git that opens one is killed at GitTimeout and the call fails, saying it
// timed out. Nothing is left running.
func TestFIFOsInTheGitDirCannotBlock(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	g := f.guard(t, func(c *Config) { c.GitTimeout = testGitTimeout })
	writeFile(t, filepath.Join(f.wt, "README.md"), "edit\n")

	// .git/config is a FIFO: git blocks opening it.
	config := filepath.Join(f.wt, ".git/config")
	mkfifo(t, config)
	err := timed(t, "ResolveBaseline", func() error { _, err := g.ResolveBaseline(ctx, f.baseline); return err })
	assertTimedOut(t, "ResolveBaseline with a FIFO config", err, "")

	// Restore puts the pristine config back (shim reads the FIFO without
	// waiting and replaces it) before any git runs: no error at all.
	var rep *Report
	err = timed(t, "Restore", func() (err error) { rep, err = g.Restore(ctx, 1, f.baseline); return err })
	if err != nil {
		t.Fatalf("restore with a FIFO config: %v", err)
	}
	if !contains(rep.MetadataRestored, "config") {
		t.Errorf("config not restored: %v", rep.MetadataRestored)
	}
	if st, err := os.Lstat(config); err != nil || !st.Mode().IsRegular() {
		t.Errorf(".git/config after the restore: %v %v", st, err)
	}

	// A FIFO at packed-refs (where only git reads): shim reads the ref
	// store itself, without waiting, removes the FIFO and puts the trusted
	// refs (all packed here) back.
	tgit(t, f.wt, "pack-refs", "--all")
	packed := filepath.Join(f.wt, ".git/packed-refs")
	writeFile(t, filepath.Join(f.wt, "README.md"), "edit 2\n")
	mkfifo(t, packed)
	err = timed(t, "Restore", func() (err error) { rep, err = g.Restore(ctx, 2, f.baseline); return err })
	if err != nil {
		t.Fatalf("restore with a FIFO packed-refs: %v", err)
	}
	if !contains(rep.RefsRemoved, "packed-refs") {
		t.Errorf("refs_removed %v, want packed-refs", rep.RefsRemoved)
	}
	if got := tgit(t, f.wt, "rev-parse", "refs/heads/main", "refs/remotes/origin/main"); got != f.baseline+"\n"+f.baseline {
		t.Errorf("refs after the restore: %q", got)
	}
	if got, _ := f.blob(t, rep.SnapshotCommit, "README.md"); got != "edit 2\n" {
		t.Errorf("snapshot README %q", got)
	}

	// Registration of a worktree whose config is a FIFO: refused at once
	// (shim reads the config itself, and refuses what is not a file).
	for _, late := range []bool{false, true} {
		f2 := newFixture(t)
		mkfifo(t, filepath.Join(f2.wt, ".git/config"))
		g2, err := New(Config{Worktree: f2.wt, StateDir: f2.state, Git: "/usr/bin/git", GitTimeout: testGitTimeout})
		must(t, err)
		err = timed(t, "Register", func() error { _, err := g2.RegisterWith(ctx, RegisterOptions{Late: late}); return err })
		if code(err) != CodeWorktreeRefused || !errors.Is(err, errNotRegular) {
			t.Errorf("register (late %v) with a FIFO config = %v, want WORKTREE_REFUSED (not a regular file)", late, err)
		}
	}
	assertNoStuckGoroutine(t)
}

// stopRunner runs git like ExecRunner, except that the first git whose
// subcommand is sub is stopped (SIGSTOP, as a harness of the same uid could
// send it) before it runs, then waited for by ExecRunner's own wait-or-kill.
type stopRunner struct {
	sub     string
	mu      sync.Mutex
	stopped *exec.Cmd
}

func (r *stopRunner) Run(ctx context.Context, cmd *exec.Cmd) error {
	r.mu.Lock()
	stop := r.stopped == nil && subcommand(cmd.Args) == r.sub
	if stop {
		r.stopped = cmd
	}
	r.mu.Unlock()
	if !stop {
		// Only the stopped git may meet the deadline: every other one runs
		// to its end however slow a loaded machine makes it (one timed
		// out before the stopped one ran, with a second suite beside it).
		return ExecRunner{}.Run(context.WithoutCancel(ctx), cmd)
	}
	// The child stops itself before git runs (a SIGSTOP sent after Start
	// could land after a fast git had already finished): sh stops, and
	// would exec git only if it were ever continued.
	cmd.Args = append([]string{"/bin/sh", "-c", `kill -STOP $$; exec "$0" "$@"`, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/bin/sh"
	if err := cmd.Start(); err != nil {
		return err
	}
	return waitOrKill(ctx, cmd)
}

// killed reports whether the stopped git ended by SIGKILL.
func (r *stopRunner) killed(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped == nil {
		t.Fatalf("no git %s ran", r.sub)
	}
	ps := r.stopped.ProcessState
	if ps == nil {
		t.Fatalf("the stopped git was not waited for")
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("the stopped git ended with %v, want SIGKILL", ps)
	}
}

// TestStoppedGitIsKilledAtTheDeadline: a git stopped with SIGSTOP never
// resumes by itself; it is killed (SIGKILL ends a stopped process) at
// GitTimeout and the step fails (RESTORE_FAILED), saying it timed out;
// the repeated restore then completes with every edit saved.
func TestStoppedGitIsKilledAtTheDeadline(t *testing.T) {
	ctx := context.Background()
	for _, sub := range []string{"cat-file", "diff-files", "update-index", "fast-import", "checkout-index", "diff-index"} {
		t.Run(sub, func(t *testing.T) {
			f := newFixture(t)
			r := &stopRunner{sub: sub}
			g := f.guard(t, func(c *Config) { c.Runner = r; c.GitTimeout = testGitTimeout })
			writeFile(t, filepath.Join(f.wt, "README.md"), "edit\n")
			writeFile(t, filepath.Join(f.wt, "new.txt"), "new\n")
			err := timed(t, "Restore", func() error { _, err := g.Restore(ctx, 1, f.baseline); return err })
			assertTimedOut(t, "Restore with a stopped git "+sub, err, CodeRestoreFailed)
			r.killed(t)
			// The same restore without the stop goes through and saves the edits.
			r.mu.Lock()
			r.sub = "none"
			r.mu.Unlock()
			rep, err := g.Restore(ctx, 1, f.baseline)
			if err != nil {
				t.Fatalf("restore after the stopped git: %v", err)
			}
			if got := tgit(t, f.wt, "show", rep.SnapshotRef+":new.txt"); got != "new" {
				t.Errorf("snapshot new.txt = %q", got)
			}
			f.assertBaseline(t)
		})
	}
	t.Run("ResolveBaseline", func(t *testing.T) {
		f := newFixture(t)
		r := &stopRunner{sub: "cat-file"}
		g := f.guard(t, func(c *Config) { c.Runner = r; c.GitTimeout = testGitTimeout })
		err := timed(t, "ResolveBaseline", func() error { _, err := g.ResolveBaseline(ctx, f.baseline); return err })
		assertTimedOut(t, "ResolveBaseline with a stopped git", err, "")
		r.killed(t)
	})
	assertNoStuckGoroutine(t)
}

// TestGitTimeoutConfig: a negative GitTimeout is refused; 0 is the default.
func TestGitTimeoutConfig(t *testing.T) {
	if _, err := New(Config{Worktree: "/tmp/wt", StateDir: "/tmp/s", GitTimeout: -1}); code(err) != CodeBadRequest {
		t.Errorf("negative GitTimeout: %v", err)
	}
	g, err := New(Config{Worktree: "/tmp/wt", StateDir: "/tmp/s"})
	must(t, err)
	if g.gitTimeout != DefaultGitTimeout {
		t.Errorf("default git timeout %s", g.gitTimeout)
	}
}
