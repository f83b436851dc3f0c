package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
)

// envOf is generation n's env as its start got it.
func (f *fixture) envOf(n uint64) map[string]string {
	f.t.Helper()
	f.rt.mu.Lock()
	defer f.rt.mu.Unlock()
	g, ok := f.rt.gens[n]
	if !ok {
		f.t.Fatalf("generation %d not live", n)
	}
	env := map[string]string{}
	for _, kv := range g.spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := env[k]; dup {
			f.t.Errorf("%s twice in the env", k)
		}
		env[k] = v
	}
	return env
}

func readHandoff(t *testing.T, path string) api.Abandoned {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var h api.Abandoned
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestTheNextGenerationIsToldWhereTheAbandonedWorkIs(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "B"))
	env := f.envOf(1)
	if _, ok := env[EnvPreviousGeneration]; ok {
		t.Errorf("generation 1 follows nothing, yet got %v", env)
	}
	f.mustStart(2, withWorktree("/w", "B"), func(r *api.StartRequest) {
		r.User = "65534"
		r.Env = []string{"KEEP=1", EnvPreviousGeneration + "=99", EnvAbandonedFile + "=/tmp/forged"}
	})
	env = f.envOf(2)
	path := filepath.Join(f.dir, "handoff", "2.json")
	want := map[string]string{"KEEP": "1", EnvPreviousGeneration: "1", EnvPreviousSnapshotRef: "refs/shim/abandoned/1",
		EnvPreviousSnapshotCommit: "5a5a", EnvPreviousPushed: api.PushedUnknown, EnvAbandonedFile: path}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	h := readHandoff(t, path)
	if h.Generation != 2 || h.PreviousGeneration != 1 || h.SnapshotRef != "refs/shim/abandoned/1" || h.SnapshotCommit != "5a5a" ||
		h.Worktree != "/w" || h.Pushed != api.PushedUnknown {
		t.Errorf("hand-off %+v", h)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o440 || st.Uid != 65534 || st.Gid != 65534 {
		t.Errorf("hand-off file mode %v owner %d:%d, want 0440 65534:65534", fi.Mode().Perm(), st.Uid, st.Gid)
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o711 {
		t.Errorf("hand-off dir: %v %v", di.Mode(), err)
	}
	// The next one's replaces it: one file, whatever the number of generations.
	f.mustStart(3, withWorktree("/w", "B"))
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("generation 2's hand-off still there: %v", err)
	}
	if h := readHandoff(t, filepath.Join(f.dir, "handoff", "3.json")); h.PreviousGeneration != 2 {
		t.Errorf("generation 3's hand-off: %+v", h)
	}
}

// A generation announced after a fence that ended the one before (nothing
// left for its own announcement to fence) is told all the same, from the
// fenced generation's record.
func TestAGenerationAfterAFenceIsToldFromTheRecord(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, withWorktree("/w", "B"))
	if _, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 2, Worktree: "/w", Baseline: "B"}); err != nil {
		t.Fatal(err)
	}
	res := f.mustStart(2, withWorktree("/w", "B"))
	if len(res.Fenced) != 0 {
		t.Fatalf("the start fenced %v", res.Fenced)
	}
	env := f.envOf(2)
	if env[EnvPreviousGeneration] != "1" || env[EnvPreviousSnapshotRef] != "refs/shim/abandoned/1" {
		t.Errorf("env %v", env)
	}
}

func TestTheHandoffIsBoundedAndSaysWhetherItPushed(t *testing.T) {
	var paths []api.PathChange
	for i := range 500 {
		paths = append(paths, api.PathChange{Path: fmt.Sprintf("dir/file-%03d", i), Change: "added"})
	}
	rep := &api.FenceReport{Generation: 4, Worktree: &api.WorktreeReport{Worktree: "/w", SnapshotRef: "refs/shim/abandoned/4",
		SnapshotCommit: "c0ffee", Added: 500, Paths: paths,
		Fetch: &api.FetchReport{Remote: "origin", Branch: "main", RemoteMoved: true, RemoteCommitCount: 2}}}
	h := abandonedFrom(5, rep)
	if len(h.Paths) != handoffMaxPaths || !h.PathsTruncated || h.Added != 500 {
		t.Errorf("paths %d truncated %v added %d", len(h.Paths), h.PathsTruncated, h.Added)
	}
	if h.Pushed != api.PushedYes || h.RemoteCommits != 2 || h.Branch != "main" {
		t.Errorf("pushed %q %d %q", h.Pushed, h.RemoteCommits, h.Branch)
	}
	rep.Worktree.Fetch = &api.FetchReport{Remote: "origin", Branch: "main"}
	if h := abandonedFrom(5, rep); h.Pushed != api.PushedNo {
		t.Errorf("a fetch that found nothing new: %q", h.Pushed)
	}
	rep.Worktree.Fetch = &api.FetchReport{Remote: "origin", Branch: "main", Error: "timeout"}
	if h := abandonedFrom(5, rep); h.Pushed != api.PushedUnknown {
		t.Errorf("a fetch that failed: %q", h.Pushed)
	}
	long := strings.Repeat("x", 4000)
	rep.Worktree.Paths = nil
	for range 50 {
		rep.Worktree.Paths = append(rep.Worktree.Paths, api.PathChange{Path: long, Change: "added"})
	}
	if h := abandonedFrom(5, rep); len(h.Paths) != handoffMaxPathBytes/4000 || !h.PathsTruncated {
		t.Errorf("long paths: %d kept", len(h.Paths))
	}
}

// A runtime dir whose filesystem is full never stops a start (a harness
// can fill it): the hand-off is then in the environment only. Any other
// failure to write it fails the start.
func TestAFullDiskLeavesTheHandoffInTheEnvironmentOnly(t *testing.T) {
	f := newFixture(t)
	var fail error
	writeHandoffFile = func(string, *api.Abandoned, int, int, *durableBatch) (string, error) { return "", fail }
	t.Cleanup(func() { writeHandoffFile = writeHandoff })
	f.mustStart(1, withWorktree("/w", "B"))
	fail = unix.ENOSPC
	f.mustStart(2, withWorktree("/w", "B"))
	env := f.envOf(2)
	if env[EnvPreviousSnapshotRef] != "refs/shim/abandoned/1" || env[EnvPreviousGeneration] != "1" {
		t.Errorf("env %v", env)
	}
	if _, ok := env[EnvAbandonedFile]; ok {
		t.Errorf("%s names a file that was not written", EnvAbandonedFile)
	}
	fail = unix.EIO
	if _, err := f.start(3, withWorktree("/w", "B")); api.CodeOf(err) != api.CodeStartFailed {
		t.Errorf("an I/O error: %v", err)
	}
}
