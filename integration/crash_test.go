package integration

// Issue 23: nothing lost after a crash. Shim is SIGKILLed (as PID 1 of its
// pid namespace: its harnesses die with it) at points spread over a
// layered fence, restarted on the same runtime dir, layers and cgroup
// root, and the announcement is retried. After every round: the token
// never went back, and every abandoned generation's edits are in its
// snapshot ref, which resolves. SHIM_CRASH_ROUNDS makes the run longer
// (scripts/crash runs it with many).

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/layers"
)

// crashGen edits, commits nothing, and creates a file of its own, then
// waits to be fenced.
const crashGen = `
OUT=$1 N=$2
echo "edit of generation $N" >> README.md
echo "$N" > "file-$N.txt"
rm -f delete-me.txt
sync # durable before the test cuts the power: what is lost then is shim's doing
touch "$OUT/ready.$N"
exec sleep 1000
`

// wantCrashGenSaved checks that generation old's edits (crashGen's) are
// in its snapshot ref, which resolves, in f's worktree; when says which
// round.
func wantCrashGenSaved(t *testing.T, f *wtFixture, old int, when string) {
	t.Helper()
	ref := "refs/shim/abandoned/" + strconv.Itoa(old)
	commit, err := hgitErr(f.wt, "rev-parse", "--verify", ref+"^{commit}")
	if err != nil {
		t.Fatalf("%s: %s does not resolve after the retry: %v %s", when, ref, err, commit)
	}
	c := strings.TrimSpace(string(commit))
	if got, ok := f.blob(t, c, "file-"+strconv.Itoa(old)+".txt"); !ok || got != strconv.Itoa(old)+"\n" {
		t.Errorf("%s: %s lacks gen %d's new file (%q)", when, ref, old, got)
	}
	if got, _ := f.blob(t, c, "README.md"); !strings.Contains(got, fmt.Sprintf("edit of generation %d\n", old)) {
		t.Errorf("%s: %s lacks gen %d's edit of README.md: %q", when, ref, old, got)
	}
}

func TestLayerCrashMidFence(t *testing.T) {
	requireRoot(t)
	rounds := 6
	if v, err := strconv.Atoi(os.Getenv("SHIM_CRASH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	rd := t.TempDir()
	root := filepath.Join(cgroup2Mount(), randName("shim-it-"))
	t.Cleanup(func() { removeCgroupTree(t, root) })
	r := newLayerRigWith(t, layerOpts{iso: "auto", o: shimOpts{runtimeDir: rd, cgroupRoot: root}})
	f := r.f
	g := script(t, f.bin, "crash.sh", crashGen)
	start := func(n int) []string { return f.startArgs(n, "--cwd", f.wt, "--", g, f.out, strconv.Itoa(n)) }
	r.s.MustCtl(nil, start(1)...)
	cur, highest := 1, uint64(1)
	for i := 0; i < rounds; i++ {
		old, next := cur, cur+1
		eventually(t, 30*time.Second, fmt.Sprintf("gen %d edited", old), func() bool {
			_, err := os.Stat(filepath.Join(f.out, "ready."+strconv.Itoa(old)))
			return err == nil
		})
		// Announce next and kill shim somewhere in its fence: the kill
		// points spread over the first 600 ms (the fence and the start
		// take 50-150 ms here); where exactly is what the round tests,
		// nothing waits on it.
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.s.Ctl(start(next)...)
		}()
		delay := i * 600 / rounds
		time.Sleep(time.Duration(delay) * time.Millisecond)
		r.s.Stop()
		<-done
		r.start(t)
		var st api.Status
		r.s.MustCtl(&st, "status")
		if st.Generation < highest {
			t.Fatalf("round %d: the token went back from %d to %d", i, highest, st.Generation)
		}
		// The retry of the same announcement starts next afresh, or is
		// answered with its first answer if that was recorded before the
		// kill (its harness died with shim: the next one then goes on).
		var res api.StartResult
		r.s.MustCtl(&res, start(next)...)
		cur, highest = next, uint64(next)
		if res.Replayed {
			t.Logf("round %d (%d ms): the start of %d was recorded before the kill", i, delay, next)
			if res.State != api.GenGone {
				t.Errorf("round %d: the replayed answer says generation %d is %q; its harness died with shim (want %q)", i, next, res.State, api.GenGone)
			}
			var st api.Status
			r.s.MustCtl(&st, "status")
			if st.State == api.StateRunning || (st.Current != nil && st.Current.State == api.GenAdopted) {
				t.Errorf("round %d: status says %q (current %+v) for a generation with no process", i, st.State, st.Current)
			}
			r.s.MustCtl(nil, start(next+1)...)
			cur, highest = next+1, uint64(next+1)
		}
		wantCrashGenSaved(t, f, old, fmt.Sprintf("round %d (killed %d ms into the fence)", i, delay))
	}
}

// TestLayerUnconfirmedSnapshotIsPinned: a worktree layer whose snapshot
// ref does not name the commit its marker records (the ref a power cut
// left empty) is pinned when the layers are pruned, and status says why;
// the control, the same with the ref whole, is pruned.
func TestLayerUnconfirmedSnapshotIsPinned(t *testing.T) {
	for _, broken := range []bool{true, false} {
		t.Run(map[bool]string{true: "ref-emptied", false: "control-ref-whole"}[broken], func(t *testing.T) {
			r := newLayerRig(t, "auto", "--keep-layers", "1")
			f, s := r.f, r.s
			g := script(t, f.bin, "crash.sh", crashGen)
			start := func(n int) []string { return f.startArgs(n, "--cwd", f.wt, "--", g, f.out, strconv.Itoa(n)) }
			s.MustCtl(nil, start(1)...)
			eventually(t, 30*time.Second, "gen 1 edited", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "ready.1"))
				return err == nil
			})
			s.MustCtl(nil, start(2)...) // gen 1's layer is the newest fenced: kept
			layer := filepath.Join(r.layers, "wt", layers.WorktreeKey(f.wt), "1")
			if _, err := os.Stat(layer); err != nil {
				t.Fatalf("gen 1's layer is not kept after gen 2's fence: %v", err)
			}
			if broken {
				// What a power cut before the ref's sync left (this
				// namespace has no lock on the checkout).
				ref := filepath.Join(f.wt, ".git", "refs", "shim", "abandoned", "1")
				if err := os.MkdirAll(filepath.Dir(ref), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(ref, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			s.MustCtl(nil, start(3)...) // gen 1's layer is beyond --keep-layers now
			if !broken {
				eventually(t, 30*time.Second, "gen 1's layer pruned", func() bool {
					_, err := os.Stat(layer)
					return os.IsNotExist(err)
				})
				return
			}
			var st api.Status
			eventually(t, 30*time.Second, "gen 1's layer pinned", func() bool {
				s.MustCtl(&st, "status")
				return len(st.Isolation.Pinned) > 0
			})
			p := st.Isolation.Pinned[0]
			if p.Generation != 1 || !strings.Contains(p.Why, "refs/shim/abandoned/1") || p.Bytes <= 0 {
				t.Errorf("status lists %+v", st.Isolation.Pinned)
			}
			if b, err := os.ReadFile(filepath.Join(layer, "upper", "file-1.txt")); err != nil || string(b) != "1\n" {
				t.Errorf("gen 1's edits are not in its pinned layer: %q %v", b, err)
			}
		})
	}
}
