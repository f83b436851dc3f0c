package integration

// Issue 22: the trusted lower stays trusted. A layered worktree's lower
// (the checkout every generation's overlay lies on) is read-only to every
// process in shim's mount namespace, root's included (a read-only bind of
// the checkout on itself); shim reads and writes it through a view under
// the layers dir that only root and shim's gits may enter; and no process
// shim runs as the harness's uid outside a generation is within the
// harness's reach (it holds a capability the harness lacks). Each attack
// has its control in the same test: the same attack against what the
// guarantee does not cover works.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/testutil"
)

// lowerPoisoner is gen 1: it plants an fsmonitor hook (a script in the
// shared out dir) in the lower's .git/config through every process of its
// uid outside its own cgroup it finds: /proc/<pid>/root/<worktree>/.git,
// /proc/<pid>/cwd/.git and /proc/<pid>/root/<view>/.git. Each success is a
// line of $OUT/planted; it stops when $OUT/stop exists.
const lowerPoisoner = `
OUT=$1 WT=$2 VIEW=$3
me=$(id -u)
mine=$(cat /proc/self/cgroup)
printf '#!/bin/sh\necho fsmonitor >> "%s/marker"\nexit 1\n' "$OUT" > "$OUT/fsmon"
chmod 755 "$OUT/fsmon"
: > "$OUT/planted"
touch "$OUT/ready"
while [ ! -e "$OUT/stop" ]; do
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$(stat -c %u "$d" 2>/dev/null)" = "$me" ] || continue
    [ "$(cat "$d/cgroup" 2>/dev/null)" = "$mine" ] && continue
    for g in "$d/root$WT/.git" "$d/cwd/.git" "$d/root$VIEW/.git"; do
      if [ -f "$g/config" ] && printf '[core]\n\tfsmonitor = %s/fsmon\n' "$OUT" >> "$g/config" 2>/dev/null; then
        echo "$p $g" >> "$OUT/planted"
      fi
    done
  done
done
exec sleep 1000
`

// lowerCheck is gen 2 and 3: its git reads the repository's config (and
// runs an fsmonitor hook planted there), then it waits.
const lowerCheck = `
OUT=$1 WT=$2 N=$3
cd "$WT" && git status --porcelain --untracked-files=all > "$OUT/status.$N" 2>&1
touch "$OUT/done.$N"
exec sleep 1000
`

// nsenterAs starts argv as uid in shim's mount and pid namespaces with its
// working directory at wd (entered as root, before the uid is taken): a
// process of the harness's uid outside any generation, as `docker exec -u`
// makes one. It dies with the test (pdeathsig) or at cleanup.
func nsenterAs(t *testing.T, s *Shim, uid int, wd string, argv ...string) *exec.Cmd {
	t.Helper()
	testutil.NeedTool(t, "nsenter")
	testutil.NeedTool(t, "setpriv")
	u := strconv.Itoa(uid)
	args := []string{"-t", strconv.Itoa(s.Cmd.Process.Pid), "-m", "-p", "--wdns=" + wd, "--",
		"setpriv", "--reuid", u, "--regid", u, "--clear-groups", "--pdeathsig", "KILL", "--"}
	cmd := exec.Command("nsenter", append(args, argv...)...)
	return cmd
}

// lowerView is where shim reads and writes the locked worktree wt.
func lowerView(r *layerRig, wt string) string {
	return filepath.Join(r.layers, "lower", layers.WorktreeKey(wt))
}

func TestLowerPoisonedThroughShimsGits(t *testing.T) {
	r := newLayerRig(t, "auto")
	f, s := r.f, r.s
	view := lowerView(r, f.wt)
	g1 := script(t, f.bin, "poison.sh", lowerPoisoner)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out, f.wt, view)...)
	eventually(t, 30*time.Second, "gen 1 scanning", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})

	// Shim's own gits as the owner, while gen 1 scans /proc for them:
	// snapshot queries (the route the review used) and a registration's
	// worth of listing, 100 rounds.
	for i := 0; i < 100; i++ {
		var list api.SnapshotList
		s.MustCtl(&list, "snapshots", "--worktree", f.wt)
	}
	if b, _ := os.ReadFile(filepath.Join(f.out, "planted")); len(b) > 0 {
		t.Fatalf("gen 1 wrote the lower through a git of shim's:\n%s", b)
	}
	// Shim's own view of the lower and the checkout's path are closed to
	// the harness's uid in shim's namespace.
	for try, why := range map[string]string{
		"echo x >> " + f.wt + "/.git/config":     "Read-only file system",
		"ls " + view:                             "Permission denied",
		"echo x >> " + view + "/.git/config":     "Permission denied",
		"touch " + f.wt + "/.git/hooks/pwn":      "Read-only file system",
		"ls " + filepath.Dir(filepath.Dir(view)): "",
	} {
		out, err := nsenterAs(t, s, wtUID, "/", "sh", "-c", try).CombinedOutput()
		if why == "" {
			// The layers dir may be passed through, not listed.
			why = "Permission denied"
		}
		if err == nil || !strings.Contains(string(out), why) {
			t.Errorf("a process of the harness's uid in shim's namespace: %s: %v %s (want %q)", try, err, out, why)
		}
	}

	// Control: a process of the same uid that is not out of its reach,
	// its cwd in the view (as a git of shim's would have it), is a way
	// in: gen 1 plants through it.
	ctl := nsenterAs(t, s, wtUID, view, "sleep", "1000")
	if err := ctl.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctl.Process.Kill(); ctl.Wait() })
	eventually(t, 60*time.Second, "control: gen 1 plants through an unprotected process", func() bool {
		b, _ := os.ReadFile(filepath.Join(f.out, "planted"))
		return strings.Contains(string(b), "/cwd/.git")
	})
	ctl.Process.Kill()
	ctl.Wait()
	if b, _ := os.ReadFile(filepath.Join(f.wt, ".git", "config")); !strings.Contains(string(b), "fsmon") {
		t.Fatalf("control: the plant is not in the lower's config:\n%s", b)
	}

	// The fence's lower check puts the trusted config back before gen 2
	// starts, and says so; neither gen 2's nor gen 3's git runs the hook.
	if err := os.WriteFile(filepath.Join(f.out, "stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	chk := script(t, f.bin, "check.sh", lowerCheck)
	for gen := 2; gen <= 3; gen++ {
		var res api.StartResult
		s.MustCtl(&res, f.startArgs(gen, "--", chk, f.out, f.wt, strconv.Itoa(gen))...)
		eventually(t, 30*time.Second, fmt.Sprintf("gen %d ran git", gen), func() bool {
			_, err := os.Stat(filepath.Join(f.out, "done."+strconv.Itoa(gen)))
			return err == nil
		})
		if len(res.Fenced) != 1 || res.Fenced[0].Worktree == nil || res.Fenced[0].Worktree.Lower == nil {
			t.Fatalf("gen %d: fence report without a lower check: %+v", gen, res.Fenced)
		}
		lc := res.Fenced[0].Worktree.Lower
		if !lc.Locked {
			t.Errorf("gen %d: the lower was not locked at the fence: %+v", gen, lc)
		}
		wantRestored := gen == 2
		if got := contains(lc.MetadataRestored, "config"); got != wantRestored {
			t.Errorf("gen %d: the fence's lower check restored %v, want config restored=%v", gen, lc.MetadataRestored, wantRestored)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(f.out, "marker")); len(b) > 0 {
		t.Errorf("the planted hook ran in a later generation: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(f.wt, ".git", "config")); strings.Contains(string(b), "fsmon") {
		t.Errorf("the plant is still in the lower's config:\n%s", b)
	}
}

// TestLowerWrittenFromOutsideAGeneration is the review's tool call run as
// users run them today: a process of the harness's uid outside any
// generation (docker exec -u agent) writes the checkout while gen 1 runs.
// In shim's namespace the write is refused; the control writes the same
// checkout from outside it (the test's namespace, where shim holds no
// lock), and gen 2, on "fresh" layers, walks into it.
func TestLowerWrittenFromOutsideAGeneration(t *testing.T) {
	for _, inShim := range []bool{true, false} {
		t.Run(map[bool]string{true: "in-shim-namespace", false: "control-outside"}[inShim], func(t *testing.T) {
			r := newLayerRig(t, "auto")
			f, s := r.f, r.s
			g1 := script(t, f.bin, "gen1.sh", "echo edit >> README.md; touch \"$1/ready\"; exec sleep 1000\n")
			s.MustCtl(nil, f.startArgs(1, "--cwd", f.wt, "--", g1, f.out)...)
			eventually(t, 30*time.Second, "gen 1 edited", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "ready"))
				return err == nil
			})
			tool := "echo tool > tool.txt && echo tool >> src/main.go"
			var out []byte
			var err error
			if inShim {
				out, err = nsenterAs(t, s, wtUID, f.wt, "sh", "-c", tool).CombinedOutput()
				if err == nil || !strings.Contains(string(out), "Read-only file system") {
					t.Fatalf("a process of the harness's uid wrote the lower in shim's namespace: %v %s", err, out)
				}
			} else {
				cmd := exec.Command("setpriv", "--reuid", strconv.Itoa(wtUID), "--regid", strconv.Itoa(wtUID), "--clear-groups", "sh", "-c", tool)
				cmd.Dir = f.wt
				if out, err = cmd.CombinedOutput(); err != nil {
					t.Fatalf("control: the write outside shim's namespace failed: %v %s", err, out)
				}
			}
			chk := script(t, f.bin, "check.sh", lowerCheck)
			var res api.StartResult
			s.MustCtl(&res, f.startArgs(2, "--", chk, f.out, f.wt, "2")...)
			eventually(t, 30*time.Second, "gen 2 ran git", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "done.2"))
				return err == nil
			})
			status, _ := os.ReadFile(filepath.Join(f.out, "status.2"))
			if inShim {
				if len(status) != 0 {
					t.Errorf("gen 2 does not start clean: %q", status)
				}
				snap := hgit(t, f.wt, "show", "--format=", "--name-only", "refs/shim/abandoned/1")
				if snap != "README.md" {
					t.Errorf("gen 1's snapshot holds %q, want its own edit of README.md", snap)
				}
				return
			}
			if !strings.Contains(string(status), "tool.txt") || !strings.Contains(string(status), "src/main.go") {
				t.Errorf("control: gen 2 does not find what was written outside shim's namespace: %q", status)
			}
		})
	}
}
