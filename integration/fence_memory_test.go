package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// Issue 27: shim's memory during a fence does not follow the layer it
// saves. The harness writes a layer well past every in-memory bound:
// large files (4 x 24 MiB, stored: under the snapshot's 64 MiB cap),
// thousands of small ones in new directories, and its git's own loose
// objects (a 24 MiB blob among them) and commit. shim's peak RSS during
// the fence that saves it (VmHWM, reset by clear_refs right before the
// announcement) stays within 2x its idle RSS (measured after start, before
// any generation). Measured, not timed. The control: the snapshot holds
// every byte (so the fence did read the whole layer).
func TestFenceMemoryIsBoundedWhateverTheLayer(t *testing.T) {
	r := newLayerRig(t, "auto")
	f, s := r.f, r.s
	pid := s.Cmd.Process.Pid
	idle := procStatusKB(t, pid, "VmRSS:")
	g1 := script(t, f.bin, "big.sh", `
OUT=$1
for i in 1 2 3 4; do head -c 25165824 /dev/urandom > big$i.bin; done
mkdir -p many
i=0; while [ $i -lt 60 ]; do
  mkdir -p many/d$i; j=0
  while [ $j -lt 50 ]; do head -c 4096 /dev/urandom > many/d$i/f$j; j=$((j+1)); done
  i=$((i+1))
done
git add big1.bin many/d0 && git commit -qm "the harness's own" >/dev/null
touch "$OUT/ready"
exec sleep 1000
`)
	var r1 api.StartResult
	s.MustCtl(&r1, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 120*time.Second, "gen 1 wrote its layer", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	before := procStatusKB(t, pid, "VmRSS:")
	var r2 api.StartResult
	s.MustCtl(&r2, f.startArgs(2, "--", "sleep", "1000")...)
	peak := procStatusKB(t, pid, "VmHWM:")
	t.Logf("shim RSS: idle %d KiB, before the fence %d KiB, peak during it %d KiB (%.2fx idle)", idle, before, peak, float64(peak)/float64(idle))
	if len(r2.Fenced) != 1 || r2.Fenced[0].Worktree == nil || r2.Fenced[0].Worktree.SnapshotCommit == "" {
		t.Fatalf("no snapshot: %+v", r2.Fenced)
	}
	snap := r2.Fenced[0].SnapshotRef
	for _, p := range []string{"big1.bin", "big4.bin", "many/d59/f49"} {
		want := int64(4096)
		if strings.HasPrefix(p, "big") {
			want = 25165824
		}
		if got := f.blobSize(t, snap, p); got != want {
			t.Errorf("the snapshot's %s has %d bytes, want %d", p, got, want)
		}
	}
	if ns := r2.Fenced[0].Worktree.NotStored; len(ns) != 0 {
		t.Errorf("not stored: %+v", ns)
	}
	if peak > 2*idle {
		t.Errorf("shim's peak RSS during the fence %d KiB is more than 2x its idle RSS %d KiB", peak, idle)
	}
}

func procStatusKB(t *testing.T, pid int, key string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, key); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}
