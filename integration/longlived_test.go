package integration

// Issue 13 through the real binary: a long-lived sandbox keeps its
// worktree usable, its disk bounded by policy, and its fencing token
// through the loss of state.json.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/sandbox"
)

// asWTUID runs plain git as the worktree's owner (the control: what a
// harness's git meets).
func asWTUID(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@example.invalid", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@example.invalid"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: wtUID, Gid: wtUID}}
	return cmd.CombinedOutput()
}

// An index.lock (and gc.log.lock) a killed git left while no generation
// is live: the next announcement has nothing to fence, and still the new
// harness's first commit works.
func TestAnAnnouncementWithNothingToFenceLeavesTheWorktreeUsable(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	gd := filepath.Join(f.wt, ".git")
	plant := func() {
		for _, n := range []string{"index.lock", "gc.log.lock"} {
			writeFile(t, filepath.Join(gd, n), "", 0o644)
			os.Lchown(filepath.Join(gd, n), wtUID, wtUID)
		}
	}
	plant()
	// Control: with the lock there, a commit fails.
	if out, err := asWTUID(f.wt, "commit", "--allow-empty", "-qm", "control"); err == nil || !strings.Contains(string(out), "index.lock") {
		t.Fatalf("control: a commit with index.lock present: %v %s", err, out)
	}
	commit := script(t, f.bin, "commit.sh", `echo edit >> README.md && git commit -qam "first commit" && touch "$1/committed"`)
	var r api.StartResult
	s.MustCtl(&r, f.startArgs(1, "--", commit, f.out)...)
	var exit api.Exit
	s.MustCtl(&exit, "wait", "--generation", "1")
	if exit.ExitCode != 0 {
		t.Fatalf("generation 1's commit failed: %+v\n%s", exit, readString(t, filepath.Join(s.RuntimeDir, "gen", "1", "stderr")))
	}
	if !slices.Contains(r.WorktreeCleaned, "index.lock") || !slices.Contains(r.WorktreeCleaned, "gc.log.lock") {
		t.Errorf("worktree_cleaned %v", r.WorktreeCleaned)
	}
	// Again after a fence-only announcement: nothing live, a new lock.
	s.MustCtl(nil, "fence", "--generation", "2")
	plant()
	s.MustCtl(&r, f.startArgs(2, "--", commit, f.out)...)
	s.MustCtl(&exit, "wait", "--generation", "2")
	if exit.ExitCode != 0 || !slices.Contains(r.WorktreeCleaned, "index.lock") {
		t.Errorf("after a fence: exit %+v, cleaned %v", exit, r.WorktreeCleaned)
	}
}

// Retention through the binary: records, snapshot refs (with their
// objects) and the report of the fence that pruned them.
func TestRetentionBoundsRecordsAndSnapshots(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{args: []string{"--keep-snapshots", "2", "--keep-generations", "3"}})
	edit := script(t, f.bin, "edit.sh", `echo "$2" > "gen-$2.txt" && git add -A && git commit -qm "gen $2" && touch "$1/done-$2"`)
	commits := map[int]string{}
	var pruned []string
	objectsPruned := false
	for gen := 1; gen <= 6; gen++ {
		var r api.StartResult
		s.MustCtl(&r, f.startArgs(gen, "--", edit, f.out, strconv.Itoa(gen))...)
		eventually(t, 10*time.Second, "the edit", func() bool {
			_, err := os.Stat(filepath.Join(f.out, "done-"+strconv.Itoa(gen)))
			return err == nil
		})
		for _, rep := range r.Fenced {
			if rep.Error != nil {
				t.Fatalf("fence of %d: %+v", rep.Generation, rep.Error)
			}
			commits[int(rep.Generation)] = rep.SnapshotCommit
			if m := rep.Worktree.Maintenance; m != nil {
				pruned = append(pruned, m.SnapshotsPruned...)
				objectsPruned = objectsPruned || m.ObjectsPruned
			}
		}
	}
	// 5 snapshots (1-5), keep 2 with a batch of 1: pruned once 4 existed.
	if len(pruned) == 0 || !objectsPruned {
		t.Fatalf("no fence report says it pruned a snapshot: %v", pruned)
	}
	for _, ref := range pruned {
		n, _ := strconv.Atoi(strings.TrimPrefix(ref, "refs/shim/abandoned/"))
		if _, err := hgitErr(f.wt, "cat-file", "-e", commits[n]); err == nil {
			t.Errorf("%s pruned but its commit %s is still in the object store", ref, commits[n])
		}
		if _, err := hgitErr(f.wt, "rev-parse", "-q", "--verify", ref); err == nil {
			t.Errorf("%s still resolves", ref)
		}
	}
	ents, _ := os.ReadDir(filepath.Join(s.RuntimeDir, "gen"))
	if len(ents) > 3 {
		t.Errorf("%d generation records kept, want at most 3", len(ents))
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Retention == nil || st.Retention.KeepSnapshots != 2 || st.Retention.Records != len(ents) || len(st.Retention.Snapshots) != 1 ||
		st.Retention.Snapshots[0].Kept > 3 || st.Retention.AuditFiles < 1 {
		t.Errorf("status retention: %+v", st.Retention)
	}
}

// Every form of state.json at a restart: shim fails closed at start, or
// starts with a token no lower than the one announced before.
func TestStateJSONFormsAtRestart(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name  string
		mod   func(t *testing.T, rd string)
		fails bool
	}{
		{"missing, records kept", func(t *testing.T, rd string) { os.Remove(filepath.Join(rd, "state.json")) }, false},
		{"missing, records and audit rotated away but the current audit file", func(t *testing.T, rd string) {
			os.Remove(filepath.Join(rd, "state.json"))
			os.RemoveAll(filepath.Join(rd, "gen"))
		}, false},
		{"only a temporary file", func(t *testing.T, rd string) {
			os.Rename(filepath.Join(rd, "state.json"), filepath.Join(rd, "state.json.tmp"))
			os.RemoveAll(filepath.Join(rd, "gen"))
		}, false},
		{"null", func(t *testing.T, rd string) { os.WriteFile(filepath.Join(rd, "state.json"), []byte("null"), 0o600) }, true},
		{"{}", func(t *testing.T, rd string) { os.WriteFile(filepath.Join(rd, "state.json"), []byte("{}"), 0o600) }, true},
		{"wrong types", func(t *testing.T, rd string) {
			os.WriteFile(filepath.Join(rd, "state.json"), []byte(`{"highest": "5"}`), 0o600)
		}, true},
		{"an array", func(t *testing.T, rd string) { os.WriteFile(filepath.Join(rd, "state.json"), []byte(`[5]`), 0o600) }, true},
		{"a directory", func(t *testing.T, rd string) {
			os.Remove(filepath.Join(rd, "state.json"))
			os.Mkdir(filepath.Join(rd, "state.json"), 0o700)
		}, true},
		{"truncated", func(t *testing.T, rd string) {
			os.WriteFile(filepath.Join(rd, "state.json"), []byte(`{"highest": 5, "sta`), 0o600)
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rd := t.TempDir()
			root := filepath.Join(cgroup2Mount(), randName("shim-it-"))
			t.Cleanup(func() { removeCgroupTree(t, root) })
			s := startShim(t, shimOpts{runtimeDir: rd, cgroupRoot: root})
			s.MustCtl(nil, "start", "--generation", "4", "--", "true")
			s.MustCtl(nil, "fence", "--generation", "5") // no record of its own in gen/
			s.Cmd.Process.Signal(syscall.SIGTERM)
			if _, ok := s.Wait(10 * time.Second); !ok {
				t.Fatal("shim did not stop")
			}
			c.mod(t, rd)
			log := &syncBuffer{}
			sb, err := sandbox.Start(sandbox.Options{Bin: shimBin, RuntimeDir: rd, CgroupRoot: root, Out: log, Ready: 5 * time.Second})
			if c.fails {
				if err == nil {
					sb.Close()
					t.Fatalf("shim started with state.json %s", c.name)
				}
				if !strings.Contains(log.String(), "recovery.md") {
					t.Errorf("the start-up error must say how to recover:\n%s", log.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("shim did not start: %v\n%s", err, log.String())
			}
			defer sb.Close()
			_, errs, code := runCtl(rd, "start", "--generation", "3", "--", "true")
			if code != 3 {
				t.Errorf("generation 3 after 5 was announced: exit %d %s", code, errs)
			}
			var st api.Status
			out, _, _ := runCtl(rd, "status")
			if err := json.Unmarshal([]byte(out), &st); err != nil || st.Generation < 5 {
				t.Errorf("token after the restart %d (%v), want >= 5", st.Generation, err)
			}
		})
	}
}
