package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// The supervisor's side through the binary: --if-current refuses an
// announcement once another supervisor moved on (nothing fenced), an
// identical retry says it is a replay, and wait --timeout says the
// generation still runs.
func TestSupervisorPreconditionsReplaysAndWaitTimeout(t *testing.T) {
	s := startShim(t, shimOpts{})
	var r1, r2, again api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--", "sleep", "1000")
	s.MustCtl(&r2, "start", "--generation", "2", "--if-current", "1", "--", "sleep", "1000")
	if len(r2.Fenced) != 1 || r2.Replayed {
		t.Fatalf("start 2 if-current 1: %+v", r2)
	}
	// The other supervisor, recovering the same step from generation 1.
	if _, errs, code := s.Ctl("start", "--generation", "3", "--if-current", "1", "--", "sleep", "1000"); code != 3 || !strings.Contains(errs, api.CodeNotCurrent) {
		t.Fatalf("start 3 if-current 1: exit %d %s", code, errs)
	}
	if _, errs, code := s.Ctl("fence", "--generation", "3", "--if-current", "1"); code != 3 || !strings.Contains(errs, api.CodeNotCurrent) {
		t.Fatalf("fence 3 if-current 1: exit %d %s", code, errs)
	}
	s.MustCtl(&again, "start", "--generation", "2", "--if-current", "1", "--", "sleep", "1000")
	if !again.Replayed || again.Pid != r2.Pid {
		t.Fatalf("an identical retry: %+v", again)
	}
	if _, errs, code := s.Ctl("wait", "--generation", "2", "--timeout", "50ms"); code == 0 || !strings.Contains(errs, api.CodeWaitTimeout) {
		t.Fatalf("wait --timeout on a running generation: exit %d %s", code, errs)
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Current == nil || st.Current.Generation != 2 || st.Pid != r2.Pid {
		t.Fatalf("gen 2 must still run: %+v", st)
	}
}

// shim ctl end: the generation itself is fenced (its worktree saved and
// restored), nothing starts, and it can never start again.
func TestSupervisorEndsAGenerationWithoutANewOne(t *testing.T) {
	s := startShim(t, shimOpts{})
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--", "sleep", "1000")
	var res api.FenceResult
	s.MustCtl(&res, "end", "--generation", "1")
	if len(res.Fenced) != 1 || res.Fenced[0].Generation != 1 || res.Fenced[0].Survivors != 0 {
		t.Fatalf("end 1: %+v", res)
	}
	if countProcs(r1.Cgroup) != 0 {
		t.Fatalf("generation 1 still has processes after its end")
	}
	if _, errs, code := s.Ctl("start", "--generation", "1", "--", "sleep", "1000"); code != 3 || !strings.Contains(errs, api.CodeStaleGeneration) {
		t.Fatalf("start 1 after its end: exit %d %s", code, errs)
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Generation != 1 || st.Current != nil || len(st.Live) != 0 {
		t.Fatalf("status after the end: %+v", st)
	}
	s.MustCtl(nil, "start", "--generation", "2", "--", "true")
}

// A supervisor restarted after a deploy finds its generation by the labels
// it announced (from the records on disk, which a restarted shim reads too).
func TestSupervisorFindsItsGenerationByLabel(t *testing.T) {
	s := startShim(t, shimOpts{})
	s.MustCtl(nil, "start", "--generation", "1", "--label", "workflow=wf-1", "--label", "step=build", "--", "true")
	s.MustCtl(nil, "start", "--generation", "2", "--label", "workflow=wf-2", "--label", "step=build", "--", "sleep", "1000")
	var list []api.Generation
	s.MustCtl(&list, "generations", "--label", "workflow=wf-2")
	if len(list) != 1 || list[0].Generation != 2 || list[0].Labels["step"] != "build" {
		t.Fatalf("by workflow=wf-2: %+v", list)
	}
	s.MustCtl(&list, "generations", "--label", "step=build")
	if len(list) != 2 || list[0].Generation != 1 || list[0].State != api.GenFenced || list[1].Generation != 2 {
		t.Fatalf("by step=build: %+v", list)
	}
	s.MustCtl(&list, "generations", "--label", "workflow=none")
	if len(list) != 0 {
		t.Fatalf("by workflow=none: %+v", list)
	}
}

// Each announcement's branch: generation 1 of task 42 is put on task-42 and
// commits there; generation 2, announced for task 43, finds the worktree
// on task-43 at the baseline, clean (not on the branch the worktree was
// registered on, nor on task-42); gen 1's commit is in its snapshot. With
// and without layers.
func TestSupervisorEachAnnouncementsBranch(t *testing.T) {
	for _, iso := range []string{"scan", "auto"} {
		t.Run(iso, func(t *testing.T) {
			f := newWTFixture(t)
			// --persist: the harnesses report there, and the test reads it.
			s := startShim(t, shimOpts{args: []string{"--isolation", iso, "--persist", f.out}})
			g1 := script(t, f.bin, "gen1.sh", `
echo gen1 > feature.txt && git add feature.txt && git commit -qm "task 42" && git rev-parse HEAD > "$1/gen1.commit"
git symbolic-ref HEAD > "$1/gen1.branch"
touch "$1/gen1.done"
exec sleep 1000
`)
			s.MustCtl(nil, f.startArgs(1, "--branch", "task-42", "--", g1, f.out)...)
			eventually(t, 30*time.Second, "generation 1's commit", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "gen1.done")) // after both files are written
				return err == nil
			})
			if b := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen1.branch"))); b != "refs/heads/task-42" {
				t.Fatalf("generation 1 is on %q", b)
			}
			g2 := script(t, f.bin, "gen2.sh", gen2Script)
			var r2 api.StartResult
			s.MustCtl(&r2, f.startArgs(2, "--branch", "task-43", "--", g2, f.out)...)
			eventually(t, 30*time.Second, "generation 2's observations", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "gen2.done"))
				return err == nil
			})
			if b := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen2.branch"))); b != "refs/heads/task-43" {
				t.Errorf("generation 2 is on %q, want refs/heads/task-43", b)
			}
			if h := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen2.head"))); h != f.baseline {
				t.Errorf("generation 2's HEAD %s, want the baseline %s", h, f.baseline)
			}
			if st := readString(t, filepath.Join(f.out, "gen2.status")); st != "" {
				t.Errorf("generation 2 finds a dirty worktree: %q", st)
			}
			commit := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen1.commit")))
			if len(r2.Fenced) != 1 || r2.Fenced[0].SnapshotRef == "" {
				t.Fatalf("fenced: %+v", r2.Fenced)
			}
			if _, err := hgitErr(f.wt, "merge-base", "--is-ancestor", commit, r2.Fenced[0].SnapshotRef); err != nil {
				t.Errorf("generation 1's commit on task-42 is not in its snapshot")
			}
		})
	}
}
