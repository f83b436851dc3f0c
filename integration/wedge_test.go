package integration

// Issue 10, the scan fallback: one command of the harness's uid that made
// every later fence fail (RESTORE_FAILED until a person repaired the
// worktree) or stall (300 s a fence for a 40 GiB sparse file), or that let
// gen 1's refs reach gen 2. Through the real binary, gen 1 (the
// unprivileged owner of the worktree) edits README.md, runs the wedge and
// waits; gen 2 is announced and must start on the baseline, on main, in a
// clean worktree, with the edit in the snapshot. The control runs the same
// wedge in a second checkout and shows it against plain git as the owner
// (reset --hard and clean -ffdx, or the `add -A` the snapshot ran before).

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// wedgeAsOwner runs script as wtUID in the worktree.
func wedgeAsOwner(f *wtFixture, script string) (string, error) {
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = f.wt
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + f.home, "LC_ALL=C", "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@example.invalid",
		"GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@example.invalid"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: wtUID, Gid: wtUID, Groups: []uint32{}}}
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

const wedgePlainReset = "git reset -q --hard && git clean -qffdx"

type wedgeRun struct {
	name  string
	wedge string // gen 1, in the worktree, after its edit
	// control runs after the wedge in another checkout (as the owner) and
	// must fail; "" for none (the sparse file: its control is 300 s).
	control string
	check   func(t *testing.T, f *wtFixture, rep api.FenceReport)
}

var wedgeRuns = []wedgeRun{
	{name: "fifo-tracked", wedge: "rm src/main.go && mkfifo src/main.go", control: "git add -A"},
	{name: "mode-000-file", wedge: "echo edited > src/lib/lib.go && chmod 000 src/lib/lib.go", control: "git add -A"},
	{name: "mode-000-dir", wedge: "echo new > src/lib/new.go && chmod 000 src/lib", control: wedgePlainReset},
	{name: "read-only-dirs", wedge: "echo changed > src/main.go && chmod 555 . src docs", control: wedgePlainReset},
	{name: "read-only-objects", wedge: "chmod -R a-w .git/objects", control: "git add -A"},
	{name: "sparse-40g", wedge: "truncate -s 40G huge.bin && truncate -s 40G docs/guide.txt",
		check: func(t *testing.T, f *wtFixture, rep api.FenceReport) {
			w := worktreeReport(t, rep)
			got := map[string]bool{}
			for _, n := range w.NotStored {
				got[n.Path] = n.Size == 40<<30 && n.Type == "file" && n.HashedBytes > 0
			}
			if !got["huge.bin"] || !got["docs/guide.txt"] {
				t.Errorf("not_stored %+v, want huge.bin and docs/guide.txt at 40 GiB", w.NotStored)
			}
			// Listed in the snapshot's message too, and not stored.
			msg := hgit(t, f.wt, "log", "-1", "--format=%B", rep.SnapshotCommit)
			for _, p := range []string{"huge.bin", "docs/guide.txt"} {
				if !strings.Contains(msg, "Shim-Not-Stored: file 42949672960 sha256:") || !strings.Contains(msg, `"`+p+`"`) {
					t.Errorf("the snapshot message does not list %s:\n%s", p, msg)
				}
				if _, ok := f.blob(t, rep.SnapshotCommit, p); ok {
					t.Errorf("the snapshot stores %s", p)
				}
			}
		}},
	{name: "planted-snapshot-ref", wedge: "git update-ref refs/shim/abandoned/1/x HEAD",
		control: "git update-ref refs/shim/abandoned/1 HEAD"},
	{name: "harness-refs", wedge: `git checkout -q -b evil && echo h > h.txt && git add h.txt && git commit -q -m harness &&
		git update-ref refs/remotes/origin/main HEAD && git tag v-evil && git branch evil2 && git checkout -q main &&
		git pack-refs --all && mkdir -p .git/rr-cache/0123 && echo x > .git/rr-cache/0123/preimage`,
		// After the plain reset the harness's refs are all still there.
		control: wedgePlainReset + ` && ! git show-ref -q --verify refs/tags/v-evil && ! test -d .git/rr-cache`,
		check: func(t *testing.T, f *wtFixture, rep api.FenceReport) {
			refs := hgit(t, f.wt, "for-each-ref", "--format=%(refname)", "refs/heads", "refs/tags", "refs/remotes")
			if refs != "refs/heads/main\nrefs/remotes/origin/main" {
				t.Errorf("refs gen 2 sees:\n%s", refs)
			}
			if got := hgit(t, f.wt, "rev-parse", "refs/remotes/origin/main"); got != f.baseline {
				t.Errorf("refs/remotes/origin/main = %s, want the baseline", got)
			}
			if _, err := os.Stat(filepath.Join(f.wt, ".git/rr-cache")); err == nil {
				t.Error("rr-cache survived")
			}
			if _, err := hgitErr(f.wt, "rev-parse", "--verify", "refs/shim/harness/1/refs/tags/v-evil"); err != nil {
				t.Error("the harness's tag is not kept under refs/shim/harness/1/")
			}
			if n := len(worktreeReport(t, rep).RefsMoved); n != 4 {
				t.Errorf("refs_moved has %d entries, want 4 (two branches, the tag, origin/main)", n)
			}
		}},
}

func TestWedgeTheScanRestore(t *testing.T) {
	for _, tc := range wedgeRuns {
		t.Run(tc.name, func(t *testing.T) {
			if tc.control != "" {
				c := newWTFixture(t)
				if out, err := wedgeAsOwner(c, "echo edit >> README.md && "+tc.wedge); err != nil {
					t.Fatalf("control wedge: %v %s", err, out)
				}
				out, err := wedgeAsOwner(c, tc.control)
				if err == nil {
					t.Fatalf("control: %q went through after the wedge; the test has no teeth", tc.control)
				}
				t.Logf("control %q: %v %s", tc.control, err, firstLine(out))
			}
			f := newWTFixture(t)
			s := startShim(t, shimOpts{})
			g1 := script(t, f.bin, "wedge.sh", fmt.Sprintf("set -e\nOUT=$1\necho edit >> README.md\n%s\ntouch \"$OUT/ready\"\nexec sleep 1000\n", tc.wedge))
			s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
			eventually(t, 30*time.Second, "gen 1 wedged the worktree", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "ready"))
				return err == nil
			})
			t0 := time.Now()
			r2, status := f.startGen2(t, s, 2)
			took := time.Since(t0)
			if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil || r2.Fenced[0].Survivors != 0 {
				t.Fatalf("fence: %+v", r2.Fenced)
			}
			rep := r2.Fenced[0]
			if got, ok := f.blob(t, rep.SnapshotCommit, "README.md"); !ok || got != f.base["README.md"]+"edit\n" {
				t.Errorf("snapshot README.md = %q", got)
			}
			if status != "" {
				t.Errorf("gen 2 finds a dirty worktree:\n%s", status)
			}
			w := worktreeReport(t, rep)
			t.Logf("announcement %v; fence ms %v; restore steps %v; repaired %v; not stored %d; refs moved %d, removed %v",
				took, rep.DurationsMS, w.DurationsMS, w.Repaired, len(w.NotStored), len(w.RefsMoved), w.RefsRemoved)
			if tc.check != nil {
				tc.check(t, f, rep)
			}
		})
	}
}

// TestWedgeBaselineRefIsTheTrustedOne: gen 1 moves refs/remotes/origin/main
// to its own commit; gen 2, announced with --baseline
// refs/remotes/origin/main, starts on the trusted value (the commit the ref
// named when shim last left the worktree), not gen 1's. Control: plain git
// resolves the ref to gen 1's commit.
func TestWedgeBaselineRefIsTheTrustedOne(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	g1 := script(t, f.bin, "move.sh", `set -e
OUT=$1
echo edit >> README.md
git checkout -q -b evil && echo h > h.txt && git add h.txt && git commit -q -m harness
git update-ref refs/remotes/origin/main HEAD
git rev-parse HEAD > "$OUT/evil"
touch "$OUT/ready"
exec sleep 1000
`)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 30*time.Second, "gen 1 moved the ref", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	evil := strings.TrimSpace(readString(t, filepath.Join(f.out, "evil")))
	if got := hgit(t, f.wt, "rev-parse", "refs/remotes/origin/main"); got != evil {
		t.Fatalf("control: plain git resolves the ref to %s, not gen 1's %s", got, evil)
	}
	args := f.startArgs(2, "--", script(t, f.bin, "gen2.sh", gen2Script), f.out)
	for i := range args {
		if args[i] == "--baseline" {
			args[i+1] = "refs/remotes/origin/main"
		}
	}
	var r2 api.StartResult
	s.MustCtl(&r2, args...)
	eventually(t, 10*time.Second, "gen 2's observations", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "gen2.done"))
		return err == nil
	})
	if head := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen2.head"))); head != f.baseline {
		t.Errorf("gen 2 started on %s, want the trusted %s (gen 1's is %s)", head, f.baseline, evil)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Baseline != f.baseline {
		t.Errorf("fence: %+v", r2.Fenced)
	}
	if got := hgit(t, f.wt, "rev-parse", "refs/shim/harness/1/refs/remotes/origin/main"); got != evil {
		t.Errorf("gen 1's ref kept as %s, want %s", got, evil)
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}
