package integration

// Issue 22, item 3: a harness makes a directory chain 25,000 deep in its
// worktree (a few seconds of work) and its fence still makes the snapshot,
// with shim's memory bounded: before, the layer walk kept a descriptor and
// a path per level (25,000 deep: EMFILE, no snapshot ref, shim at 719 MB).
// The part below the walk's depth bound (1,024) is listed, not stored.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/layers"
)

// deepChain makes deep/c24/d.../c23/d.../.../c0/d... (25 chunks of 1,000
// levels, each moved under the next: no path longer than 2 KiB is ever
// used) and edits README.md, then says ready. Its argument is the out dir.
const deepChain = `
OUT=$1
echo "edit beside the chain" >> README.md
mkdir deep && cd deep || exit 1
p=$(printf "d/%.0s" $(seq 1000))
mkdir -p "c0/$p"
i=1
while [ $i -lt 25 ]; do mkdir -p "c$i/$p" && mv "c$((i-1))" "c$i/$p" || exit 1; i=$((i+1)); done
touch "$OUT/ready"
exec sleep 1000
`

// peakRSS is a process's peak resident set (VmHWM), in bytes; 0 when
// it cannot be read. clearPeak resets it (clear_refs 5).
func peakRSS(status string) int64 {
	for _, l := range strings.Split(status, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// deepChainBound is the peak RSS shim may reach while it fences the
// chain: several times its idle RSS (10-25 MB), far below the 719 MB of
// the unbounded walk.
const deepChainBound = 128 << 20

func wantDeepChainSaved(t *testing.T, rep api.FenceReport) {
	t.Helper()
	if rep.Error != nil || rep.SnapshotRef != "refs/shim/abandoned/1" || rep.Worktree == nil {
		t.Fatalf("the fence of the chain's generation: %+v", rep)
	}
	deep := 0
	for _, n := range rep.Worktree.NotStored {
		if n.Type == "too_deep" && strings.HasPrefix(n.Path, "deep/") {
			deep++
		}
	}
	if deep != 1 {
		t.Errorf("the report lists %d too_deep entries under deep/, want 1: %+v", deep, rep.Worktree.NotStored)
	}
}

func TestLayerDeepChain(t *testing.T) {
	r := newLayerRig(t, "auto")
	f, s := r.f, r.s
	t.Cleanup(func() { s.Stop(); rmDeep(t, r.layers) }) // before the fixture's removal, which a chain this deep defeats
	g1 := script(t, f.bin, "chain.sh", deepChain)
	s.MustCtl(nil, f.startArgs(1, "--cwd", f.wt, "--", g1, f.out)...)
	eventually(t, 120*time.Second, "gen 1 made its chain", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	// The control: the chain in gen 1's layer is 25,000 deep.
	upper := filepath.Join(r.layers, "wt", layers.WorktreeKey(f.wt), "1", "upper")
	// (GNU find walks deeper than PATH_MAX; one byte a directory)
	out, err := exec.Command("find", filepath.Join(upper, "deep"), "-type", "d", "-printf", "x").Output()
	if err != nil {
		t.Fatalf("control: find: %v", err)
	}
	depth := len(out)
	if depth < 25000 {
		t.Fatalf("control: the chain is %d directories, want 25,000", depth)
	}
	pid := strconv.Itoa(s.Cmd.Process.Pid)
	if err := os.WriteFile("/proc/"+pid+"/clear_refs", []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	var r2 api.StartResult
	s.MustCtl(&r2, f.startArgs(2, "--cwd", f.wt, "--", "sleep", "1000")...)
	st, _ := os.ReadFile("/proc/" + pid + "/status")
	peak := peakRSS(string(st))
	t.Logf("a chain of %d directories: restore %.0f ms, shim's peak RSS during the fence %d MB",
		depth, r2.Fenced[0].DurationsMS["restore"], peak>>20)
	if len(r2.Fenced) != 1 {
		t.Fatalf("fenced %+v", r2.Fenced)
	}
	wantDeepChainSaved(t, r2.Fenced[0])
	if got, _ := f.blob(t, r2.Fenced[0].SnapshotCommit, "README.md"); !strings.Contains(got, "edit beside the chain") {
		t.Errorf("the snapshot lacks the edit beside the chain: %q", got)
	}
	if peak == 0 || peak > deepChainBound {
		t.Errorf("shim's peak RSS during the fence was %d MB, want at most %d", peak>>20, deepChainBound>>20)
	}
}

// TestDockerLayerDeepChain is the same under Docker with the image.
func TestDockerLayerDeepChain(t *testing.T) {
	dockerImage(t)
	vol := t.TempDir()
	t.Cleanup(func() { rmDeep(t, vol) }) // after the container's removal, before the temp dir's
	flags := append(append([]string{}, dockerFullFlags...), "-v", vol+":/var/lib/shim")
	b := dockerRun(t, flags, "--grace", "5s", "--isolation", "auto")
	srv := startGitServer(t, gitServerOpts{AnonFetch: true, Seed: map[string]string{"README.md": "# project\n"}})
	dockerClone(t, b, srv.URL)
	ctl := b.hostCtl()
	var st api.Status
	eventually(t, 30*time.Second, "the start-up probes done", func() bool {
		ctl.must(t, &st, "status")
		return st.Isolation.Mode != "probing"
	})
	if st.Isolation.Mode != "layers" {
		t.Fatalf("isolation %+v, want layers", st.Isolation)
	}
	start := func(n string, cmd ...string) api.StartResult {
		var r api.StartResult
		ctl.must(t, &r, append([]string{"start", "--generation", n, "--user", "1000:1000", "--cwd", "/workspace/repo",
			"--env", "HOME=/home/agent", "--worktree", "/workspace/repo", "--baseline", srv.Seed, "--network", "none", "--"}, cmd...)...)
		return r
	}
	start("1", "sh", "-c", deepChain, "chain", "/tmp")
	eventually(t, 180*time.Second, "gen 1 made its chain", func() bool {
		_, _, code := b.Exec("", "test", "-e", "/var/lib/shim/layers/root/1/upper/tmp/ready")
		return code == 0
	})
	b.MustExec("", "sh", "-c", "echo 5 > /proc/1/clear_refs")
	r2 := start("2", "sleep", "1000")
	peak := peakRSS(b.MustExec("", "cat", "/proc/1/status"))
	if len(r2.Fenced) != 1 {
		t.Fatalf("fenced %+v", r2.Fenced)
	}
	t.Logf("under Docker: restore %.0f ms, shim's peak RSS during the fence %d MB", r2.Fenced[0].DurationsMS["restore"], peak>>20)
	wantDeepChainSaved(t, r2.Fenced[0])
	if got := b.MustExec("agent", "git", "-C", "/workspace/repo", "show", "refs/shim/abandoned/1:README.md"); !strings.Contains(got, "edit beside the chain") {
		t.Errorf("the snapshot lacks the edit beside the chain: %q", got)
	}
	if peak == 0 || peak > deepChainBound {
		t.Errorf("shim's peak RSS during the fence was %d MB, want at most %d", peak>>20, deepChainBound>>20)
	}
}

// rmDeep removes dir and everything below it with rm -rf, which walks a
// chain deeper than Go's os.RemoveAll can (a descriptor per level).
func rmDeep(t *testing.T, dir string) {
	if out, err := exec.Command("rm", "-rf", "--one-file-system", dir).CombinedOutput(); err != nil {
		t.Errorf("rm -rf %s: %v %s", dir, err, out)
	}
}
