//go:build linux

package gitguard

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/internal/sandbox"
	"github.com/shimdev/shim/internal/snapshot"
	"golang.org/x/sys/unix"
)

// TestBenchLayers reports, side by side in one run, what giving the next
// generation a worktree at the baseline costs three ways, on the
// repositories and edits of BenchmarkRestore (N files; 100 modified, 50
// untracked in 10 new directories):
//
//   - the floor: `git reset --hard && git clean -ffdx` (loses the edits);
//   - scan: Guard.Restore;
//   - layers: the edits made through a real overlay on the worktree
//     (lower = the worktree at the baseline, .git included) in a private
//     mount namespace, then unmount + SnapshotLayer + removing the layer,
//     with the layer on a tmpfs, on the worktree's own filesystem, and (for
//     information) there with the overlay's volatile option (no sync at
//     unmount). The fence pays the snapshot ("fence"): shim holds the
//     generation's mount namespace, so the unmount (and the sync of the
//     layer's filesystem it makes) runs once the announcement is
//     answered, and the removal beside the next start; "no rm" and
//     "total" add them;
//
// and the cost moved to the next generation: its first `git status` on
// the plain worktree after the floor or the scan, and on a freshly mounted
// overlay with an empty layer.
//
// It is a measurement, not a test: nothing is asserted on time. Run as
// root (overlay mounts):
//
//	SHIM_BENCH_LAYERS=1 go test ./internal/gitguard -run TestBenchLayers -v -timeout 60m
//
// SHIM_BENCH_SIZES (default 5000,50000) and SHIM_BENCH_ROUNDS (default 9,
// at least 5) tune it; SHIM_BENCH_RAW=1 prints every sample. Every figure
// is the median of the rounds (the min is printed beside the totals),
// after one untimed warm-up round of every mode; the modes take turns in
// each round so that the machine's noise falls on all of them alike.
func TestBenchLayers(t *testing.T) {
	if os.Getenv("SHIM_BENCH_LAYERS") != "1" {
		t.Skip("set SHIM_BENCH_LAYERS=1 to run the layers benchmark")
	}
	if os.Geteuid() != 0 {
		t.Skip("the layers benchmark mounts overlays: needs root")
	}
	sizes := []int{5000, 50000}
	if s := os.Getenv("SHIM_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1000 {
				t.Fatalf("SHIM_BENCH_SIZES: %q (sizes of at least 1000)", s)
			}
			sizes = append(sizes, n)
		}
	}
	rounds := 9
	if s := os.Getenv("SHIM_BENCH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 5 {
			t.Fatalf("SHIM_BENCH_ROUNDS: %q (at least 5)", s)
		}
		rounds = n
	}
	var out strings.Builder
	for _, n := range sizes {
		lb := newLayerBench(t, n)
		lb.run(t, rounds)
		lb.print(&out, rounds)
		t.Log("\n" + out.String())
	}
	fmt.Print("\n" + out.String())
}

// A placement is where the layers live.
type placement struct {
	name     string
	dir      string
	volatile bool
}

type layerBench struct {
	n                       int
	fix                     *benchFixture
	floor, scan, lay        *fixture
	gScan, gLay             *Guard
	places                  []placement
	gen                     uint64
	samples                 map[string][]time.Duration
	fsType                  string
	packs                   int
	wtFS                    string
	sizeUpperKB, sizeIdxKiB int64
}

func newLayerBench(t *testing.T, n int) *layerBench {
	t.Helper()
	start := time.Now()
	lb := &layerBench{n: n, fix: benchRepo(t, n), samples: map[string][]time.Duration{}}
	lb.floor = lb.fix.clone(t)
	lb.scan = lb.fix.clone(t)
	lb.lay = lb.fix.clone(t)
	lb.gScan = lb.scan.guard(t, nil)
	lb.gLay = lb.lay.guard(t, nil)
	if !lb.gLay.GitDirInside() {
		t.Fatal("the layers clone's git dir is not its .git")
	}
	lb.wtFS = fsName(t, lb.lay.wt)
	// Let every file of the checkouts be older than the index, so that
	// the first status of each mode does not re-read racily clean
	// entries the clone left (the benchmark's fixture, not a wait for
	// anything).
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
	for _, f := range []*fixture{lb.floor, lb.scan, lb.lay} {
		benchRun(t, f.wt, harnessEnv(), "update-index", "-q", "--refresh")
	}
	if st, err := os.Stat(filepath.Join(lb.lay.wt, ".git", "index")); err == nil {
		lb.sizeIdxKiB = st.Size() >> 10
	}

	root := t.TempDir()
	tmpfs := filepath.Join(root, "tmpfs")
	must(t, os.Mkdir(tmpfs, 0o700))
	must(t, unix.Mount("shim-bench", tmpfs, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size=1g"))
	t.Cleanup(func() {
		if err := unix.Unmount(tmpfs, 0); err != nil {
			t.Errorf("unmount %s: %v", tmpfs, err)
			unix.Unmount(tmpfs, unix.MNT_DETACH)
		}
	})
	disk := filepath.Join(root, "disk")
	must(t, os.Mkdir(disk, 0o700))
	if a, b := devOf(t, disk), devOf(t, lb.lay.wt); a != b {
		t.Logf("note: %s and the worktree %s are on different filesystems", disk, lb.lay.wt)
	}
	fs := fsName(t, disk)
	lb.fsType = fs
	lb.places = []placement{
		{name: "tmpfs", dir: tmpfs},
		{name: fs, dir: disk},
		{name: fs + " volatile", dir: disk, volatile: true},
	}
	// The overlay must mount here at all.
	ns, err := sandbox.NewMountNS()
	must(t, err)
	defer ns.Close()
	probe := filepath.Join(tmpfs, "probe")
	must(t, os.MkdirAll(filepath.Join(probe, "upper"), 0o700))
	must(t, os.MkdirAll(filepath.Join(probe, "work"), 0o700))
	if err := ns.Do(func() error { return benchOverlay(lb.lay.wt, probe, false) }); err != nil {
		t.Skipf("no overlay mount here: %v", err)
	}
	must(t, ns.Do(func() error { return unix.Unmount(lb.lay.wt, 0) }))
	must(t, os.RemoveAll(probe))
	t.Logf("files=%d: fixtures in %v (worktree on %s)", n, time.Since(start).Round(time.Millisecond), lb.wtFS)
	return lb
}

func (lb *layerBench) add(k string, d time.Duration, timed bool) {
	if timed {
		lb.samples[k] = append(lb.samples[k], d)
	}
}

func (lb *layerBench) run(t *testing.T, rounds int) {
	ctx := context.Background()
	floor := func(iter int, timed bool) {
		must(t, layerEdits(lb.floor.wt, lb.n, iter))
		t0 := time.Now()
		benchRun(t, lb.floor.wt, testEnv(os.TempDir()), "reset", "-q", "--hard")
		benchRun(t, lb.floor.wt, testEnv(os.TempDir()), "clean", "-ffdxq")
		lb.add("floor", time.Since(t0), timed)
		d, out := timedStatus(t, lb.floor.wt)
		checkClean(t, "after the floor", out)
		lb.add("status floor", d, timed)
	}
	scan := func(iter int, timed bool) {
		must(t, layerEdits(lb.scan.wt, lb.n, iter))
		lb.gen++
		t0 := time.Now()
		rep, err := lb.gScan.Restore(ctx, lb.gen, lb.scan.baseline)
		lb.add("scan", time.Since(t0), timed)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Modified != 100 || rep.Added != 50 {
			t.Fatalf("scan report m=%d a=%d", rep.Modified, rep.Added)
		}
		d, out := timedStatus(t, lb.scan.wt)
		checkClean(t, "after the scan", out)
		lb.add("status scan", d, timed)
	}
	var layered []func(int, bool)
	for _, p := range lb.places {
		layered = append(layered, func(iter int, timed bool) {
			lb.gen++
			lb.layerRound(t, p, iter, timed, !timed)
		})
	}
	plain := []func(int, bool){floor, scan}
	for i := -1; i < rounds; i++ {
		// The floor and the scan first, then the layer modes, each
		// group in an order that turns with the round: the first layer
		// snapshot after a floor or a scan is measured 15-20 ms slower
		// in its import (not its fsync), so every placement takes that
		// place as often as the others. Each mode's edits start on a
		// synced filesystem: a mode's sync or fsync pays for its own
		// round's writes and not for the mode before it (data=ordered:
		// an fsync on ext4 writes back every file in the journal's
		// running transaction).
		r := max(i, 0)
		for j := range plain {
			unix.Sync()
			plain[(j+r)%len(plain)](i+1, i >= 0)
		}
		for j := range layered {
			unix.Sync()
			layered[(j+r)%len(layered)](i+1, i >= 0)
		}
	}
	packs, _ := filepath.Glob(filepath.Join(lb.lay.wt, ".git", "objects", "pack", "*.pack"))
	lb.packs = len(packs)
	// Where the snapshot's time goes, step by step (the same calls
	// SnapshotLayer makes, timed apart), on the tmpfs and disk layers.
	for i := 0; i < rounds; i++ {
		for j := range 2 {
			lb.gen++
			lb.snapshotSteps(t, lb.places[(i+j)%2], i+1)
		}
	}
}

// layerRound is one generation on a layer: mount, edits through the
// merged view, then the fence's part (unmount, snapshot, remove) timed,
// then the next generation's first status on a fresh, empty layer.
func (lb *layerBench) layerRound(t *testing.T, p placement, iter int, timed, check bool) {
	ctx := context.Background()
	wt := lb.lay.wt
	ld := freshLayer(t, p.dir, lb.gen, wt)
	ns, err := sandbox.NewMountNS()
	must(t, err)
	defer ns.Close()
	unix.Sync()
	must(t, ns.Do(func() error { return benchOverlay(wt, ld, p.volatile) }))
	must(t, ns.Do(func() error { return layerEdits(wt, lb.n, iter) }))
	if check {
		// The edits are in the merged view, as git sees it, and not in
		// the lower.
		var out []byte
		must(t, ns.Do(func() error { _, out, err = statusErr(wt); return err }))
		if m, u := bytes.Count(out, []byte(" M ")), bytes.Count(out, []byte("?? ")); m != 100 || u != 10 {
			t.Fatalf("status through the overlay: %d modified, %d untracked dirs\n%s", m, u, out)
		}
		k := (lb.n/100 + iter) % lb.n
		rel := fmt.Sprintf("d%03d/s%02d/f%05d.txt", k/500, (k/50)%10, k)
		b, err := os.ReadFile(filepath.Join(wt, rel))
		must(t, err)
		if want := fmt.Sprintf("file %d\n%0200d\n", k, k); string(b) != want {
			t.Fatalf("the lower's %s was written: %q", rel, b)
		}
		if sz := duKB(t, filepath.Join(ld, "upper")); p.name == "tmpfs" {
			lb.sizeUpperKB = sz
		}
	}
	var dUmount time.Duration
	t0 := time.Now()
	must(t, ns.Do(func() error {
		s := time.Now()
		err := unix.Unmount(wt, 0)
		dUmount = time.Since(s)
		return err
	}))
	t1 := time.Now()
	rep, err := lb.gLay.SnapshotLayer(ctx, lb.gen, lb.lay.baseline, filepath.Join(ld, "upper"))
	if err != nil {
		t.Fatal(err)
	}
	t2 := time.Now()
	must(t, os.RemoveAll(ld))
	t3 := time.Now()
	if rep.Modified != 100 || rep.Added != 50 || len(rep.NotStored) != 0 {
		t.Fatalf("layer report m=%d a=%d skipped=%v", rep.Modified, rep.Added, rep.NotStored)
	}
	lb.add("layers "+p.name, t3.Sub(t0), timed)
	lb.add("keep "+p.name, t2.Sub(t0), timed)
	imp := time.Duration(rep.DurationsMS["snapshot"] * 1e6)
	lb.add("snap.import "+p.name, imp, timed)
	lb.add("snap.describe "+p.name, time.Duration(rep.DurationsMS["total"]*1e6)-imp, timed)
	lb.add("umount "+p.name, dUmount, timed)
	lb.add("snapshot "+p.name, t2.Sub(t1), timed)
	lb.add("rm "+p.name, t3.Sub(t2), timed)
	ns.Close()

	// The next generation: a fresh namespace, an empty layer, its first
	// status.
	ld = freshLayer(t, p.dir, lb.gen+1<<32, wt)
	ns2, err := sandbox.NewMountNS()
	must(t, err)
	defer ns2.Close()
	var dMount, dStatus time.Duration
	var out []byte
	must(t, ns2.Do(func() error {
		s := time.Now()
		if err := benchOverlay(wt, ld, p.volatile); err != nil {
			return err
		}
		dMount = time.Since(s)
		dStatus, out, err = statusErr(wt)
		return err
	}))
	checkClean(t, "on a fresh layer", out)
	copied := duKB(t, filepath.Join(ld, "upper"))
	must(t, ns2.Do(func() error { return unix.Unmount(wt, 0) }))
	ns2.Close()
	must(t, os.RemoveAll(ld))
	lb.add("mount "+p.name, dMount, timed)
	lb.add("status "+p.name, dStatus, timed)
	if check && copied > 0 {
		t.Logf("note: the next generation's first status copied %d KiB up into its layer (%s)", copied, p.name)
	}
}

// snapshotSteps makes one layer and times the steps of SnapshotLayer
// apart: the guard's open, the baseline lookup, the harness objects'
// import, the walk alone (into nothing), shim's import of its typed
// changes (described by them), git fast-import of the same changes (the
// same commit), the diff-tree the description replaced (describeLayer,
// now only for the shapes the changes cannot describe), and one bare git
// spawn.
func (lb *layerBench) snapshotSteps(t *testing.T, p placement, iter int) {
	ctx := context.Background()
	wt, g := lb.lay.wt, lb.gLay
	ld := freshLayer(t, p.dir, lb.gen, wt)
	ns, err := sandbox.NewMountNS()
	must(t, err)
	defer ns.Close()
	unix.Sync()
	must(t, ns.Do(func() error { return benchOverlay(wt, ld, false) }))
	must(t, ns.Do(func() error { return layerEdits(wt, lb.n, iter) }))
	must(t, ns.Do(func() error { return unix.Unmount(wt, 0) }))
	ns.Close()
	upper := filepath.Join(ld, "upper")
	step := func(k string, fn func() error) {
		t.Helper()
		s := time.Now()
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		lb.add(k+" "+p.name, time.Since(s), true)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	rep := &Report{DurationsMS: map[string]float64{}}
	var baseTree, base string
	step("s.open", func() error { return g.open(true) })
	step("s.lookup", func() error {
		res, err := g.lookup(ctx, []string{lb.lay.baseline + "^{commit}", lb.lay.baseline + "^{tree}", "refs/shim/abandoned/0", "HEAD"})
		if err == nil {
			base, baseTree = res[0].oid, res[1].oid
		}
		return err
	})
	ufd, err := openDir(upper)
	must(t, err)
	defer unix.Close(ufd)
	step("s.objects", func() error { _, _, err := g.importLayerObjects(ctx, ufd, base, baseTree, rep); return err })
	step("s.walk", func() error {
		return newLayerWalk(rep, DefaultMaxFileSize, snapshot.NewStream(io.Discard, snapshot.Commit{}), false).Run(ufd)
	})
	c := snapshot.Commit{Msg: "bench\n", BaseTree: baseTree, Parents: []string{base}, Now: time.Now().Unix()}
	step("s.inshim", func() error {
		c.Ref = fmt.Sprintf("%sbench-%d", RefPrefix, lb.gen)
		commit, described, err := g.importInShim(ctx, ufd, c, rep)
		if err == nil && !described {
			err = fmt.Errorf("the import's changes did not describe the layer")
		}
		rep.SnapshotCommit = commit
		return err
	})
	if rep.Modified != 100 || rep.Added != 50 {
		t.Fatalf("steps (from the import's changes): m=%d a=%d", rep.Modified, rep.Added)
	}
	step("s.fastimport", func() error {
		c.Ref = fmt.Sprintf("refs/shim-bench/%d", lb.gen)
		commit, err := g.importByGit(ctx, ufd, c, false, rep)
		if err == nil && commit != rep.SnapshotCommit {
			err = fmt.Errorf("fast-import made %s, shim %s", commit, rep.SnapshotCommit)
		}
		return err
	})
	*rep = Report{DurationsMS: map[string]float64{}, SnapshotCommit: rep.SnapshotCommit}
	rep.HeadBefore = base // as SnapshotLayer has it without the harness's commits: diff-tree only
	step("s.difftree", func() error { return g.describeLayer(ctx, base, baseTree, rep) })
	step("s.spawn", func() error { _, err := g.git(ctx, gitOpts{noRepo: true}, "version"); return err })
	if rep.Modified != 100 || rep.Added != 50 {
		t.Fatalf("steps: m=%d a=%d", rep.Modified, rep.Added)
	}
	must(t, os.RemoveAll(ld))
}

func (lb *layerBench) med(k string) time.Duration {
	s := append([]time.Duration(nil), lb.samples[k]...)
	if len(s) == 0 {
		return 0
	}
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (lb *layerBench) min(k string) time.Duration {
	var m time.Duration
	for i, d := range lb.samples[k] {
		if i == 0 || d < m {
			m = d
		}
	}
	return m
}

func (lb *layerBench) print(w io.Writer, rounds int) {
	msf := func(d time.Duration) string { return fmt.Sprintf("%8.1f", float64(d)/1e6) }
	floor, sfloor := lb.med("floor"), lb.med("status floor")
	ratio := func(d, of time.Duration) string { return fmt.Sprintf("%6.2fx", float64(d)/float64(of)) }
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(w, "files=%d  worktree on %s  medians of %d rounds, ms  (upper after the edits: %d KiB; index %d KiB; packs %d; loadavg %s)\n",
		lb.n, lb.wtFS, rounds, lb.sizeUpperKB, lb.sizeIdxKiB, lb.packs, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Fprintf(w, "  %-34s %8s %7s  | %8s %8s %8s | %8s %7s | %8s %7s | %8s %7s\n", "restore", "total", "/floor", "umount", "snapshot", "rm", "min", "/floor", "no rm", "/floor", "fence", "/floor")
	mins := func(k string) string {
		return fmt.Sprintf("%s %s", msf(lb.min(k)), ratio(lb.min(k), lb.min("floor")))
	}
	fmt.Fprintf(w, "  %-34s %s %s  | %26s | %s\n", "floor: reset --hard && clean -ffdx", msf(floor), ratio(floor, floor), "", mins("floor"))
	fmt.Fprintf(w, "  %-34s %s %s  | %26s | %s\n", "scan: Guard.Restore", msf(lb.med("scan")), ratio(lb.med("scan"), floor), "", mins("scan"))
	for _, p := range lb.places {
		d := lb.med("layers " + p.name)
		k := lb.med("keep " + p.name)
		fmt.Fprintf(w, "  %-34s %s %s  | %s %s %s | %s | %s %s | %s %s\n", "layers, upper on "+p.name, msf(d), ratio(d, floor),
			msf(lb.med("umount "+p.name)), msf(lb.med("snapshot "+p.name)), msf(lb.med("rm "+p.name)), mins("layers "+p.name), msf(k), ratio(k, floor),
			msf(lb.med("snapshot "+p.name)), ratio(lb.med("snapshot "+p.name), floor))
	}
	target := 0.5
	if lb.n >= 50000 {
		target = 0.2
	}
	fmt.Fprintf(w, "  target: the fence's part (\"fence\") <= %.1fx the floor (%.1f ms)\n", target, target*float64(floor)/1e6)
	fmt.Fprintf(w, "  %-34s %8s %7s  | %8s\n", "next generation's first git status", "status", "/floor", "mount")
	fmt.Fprintf(w, "  %-34s %s %s  |\n", "plain worktree after the floor", msf(sfloor), ratio(sfloor, sfloor))
	fmt.Fprintf(w, "  %-34s %s %s  |\n", "plain worktree after the scan", msf(lb.med("status scan")), ratio(lb.med("status scan"), sfloor))
	for _, p := range lb.places {
		d := lb.med("status " + p.name)
		fmt.Fprintf(w, "  %-34s %s %s  | %s\n", "fresh overlay, upper on "+p.name, msf(d), ratio(d, sfloor), msf(lb.med("mount "+p.name)))
	}
	fmt.Fprintf(w, "  SnapshotLayer's steps timed apart  %8s %8s\n", "tmpfs", lb.fsType)
	for _, k := range []string{"s.open", "s.lookup", "s.objects", "s.walk", "s.inshim", "s.fastimport", "s.difftree", "s.spawn"} {
		fmt.Fprintf(w, "    %-32s %s %s\n", strings.TrimPrefix(k, "s."), msf(lb.med(k+" tmpfs")), msf(lb.med(k+" "+lb.fsType)))
	}
	if os.Getenv("SHIM_BENCH_RAW") == "1" {
		var keys []string
		for k := range lb.samples {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  raw %-28s", k)
			for _, d := range lb.samples[k] {
				fmt.Fprintf(w, " %.1f", float64(d)/1e6)
			}
			fmt.Fprintln(w)
		}
	}
	fmt.Fprintln(w)
}

// benchOverlay mounts the worktree layer ld (its upper and work) over wt,
// as the layer stub does (internal/layers overlay).
func benchOverlay(wt, ld string, volatile bool) error {
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,index=off,metacopy=off",
		wt, filepath.Join(ld, "upper"), filepath.Join(ld, "work"))
	if volatile {
		opts += ",volatile"
	}
	return unix.Mount("shim-layer", wt, "overlay", 0, opts)
}

// freshLayer makes an empty layer for generation gen under dir, its
// upper's top with the worktree's owner and mode (as layers.NewPlan).
func freshLayer(t *testing.T, dir string, gen uint64, wt string) string {
	t.Helper()
	ld := filepath.Join(dir, strconv.FormatUint(gen, 10))
	must(t, os.RemoveAll(ld))
	must(t, os.MkdirAll(filepath.Join(ld, "upper"), 0o700))
	must(t, os.MkdirAll(filepath.Join(ld, "work"), 0o700))
	var st unix.Stat_t
	must(t, unix.Stat(wt, &st))
	must(t, os.Lchown(filepath.Join(ld, "upper"), int(st.Uid), int(st.Gid)))
	must(t, os.Chmod(filepath.Join(ld, "upper"), os.FileMode(st.Mode&0o777)))
	return ld
}

// layerEdits are benchEdits' edits, with an error instead of a test
// failure (they run on a namespace's thread).
func layerEdits(wt string, n, iter int) error {
	for k := 0; k < 100; k++ {
		i := (k*n/100 + iter) % n
		p := filepath.Join(wt, fmt.Sprintf("d%03d/s%02d/f%05d.txt", i/500, (i/50)%10, i))
		if err := os.WriteFile(p, []byte(fmt.Sprintf("edited %d in %d\n", i, iter)), 0o644); err != nil {
			return err
		}
	}
	for k := 0; k < 50; k++ {
		p := filepath.Join(wt, fmt.Sprintf("new%02d/sub/u%02d.txt", k/5, k))
		if k%5 == 0 {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(p, []byte(fmt.Sprintf("untracked %d %d\n", k, iter)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// harnessEnv is a harness's git: testEnv, but with the optional locks a
// plain git takes (its status writes back the index it refreshed).
func harnessEnv() []string {
	var env []string
	for _, e := range testEnv(os.TempDir()) {
		if !strings.HasPrefix(e, "GIT_OPTIONAL_LOCKS=") {
			env = append(env, e)
		}
	}
	return env
}

// statusErr runs a harness's first `git status` in wt (from the calling
// thread: inside a namespace when called from do) and times it.
func statusErr(wt string) (time.Duration, []byte, error) {
	cmd := exec.Command("/usr/bin/git", "status", "--porcelain")
	cmd.Dir = wt
	cmd.Env = harnessEnv()
	s := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(s)
	if err != nil {
		return d, out, fmt.Errorf("git status: %v\n%s", err, out)
	}
	return d, out, nil
}

func timedStatus(t *testing.T, wt string) (time.Duration, []byte) {
	t.Helper()
	d, out, err := statusErr(wt)
	must(t, err)
	return d, out
}

func checkClean(t *testing.T, where string, out []byte) {
	t.Helper()
	if len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("status %s is not clean:\n%s", where, out)
	}
}

func benchRun(t testing.TB, dir string, env []string, args ...string) {
	t.Helper()
	cmd := exec.Command("/usr/bin/git", append([]string{"-c", "core.hooksPath=/dev/null"}, args...)...)
	cmd.Dir = dir
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

func devOf(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Stat(p, &st))
	return st.Dev
}

// fsName names the filesystem p is on (ext4 reads as ext2/3's magic;
// /proc/self/mountinfo tells them apart).
func fsName(t *testing.T, p string) string {
	t.Helper()
	var sfs unix.Statfs_t
	must(t, unix.Statfs(p, &sfs))
	switch sfs.Type {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.EXT4_SUPER_MAGIC:
		dev := devOf(t, p)
		if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				f := strings.Fields(l)
				if len(f) < 10 {
					continue
				}
				var maj, min uint32
				if _, err := fmt.Sscanf(f[2], "%d:%d", &maj, &min); err != nil || unix.Mkdev(maj, min) != dev {
					continue
				}
				for i, x := range f {
					if x == "-" && i+1 < len(f) {
						return f[i+1]
					}
				}
			}
		}
		return "ext4"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	}
	return fmt.Sprintf("fs-%#x", sfs.Type)
}

// duKB is the space the files below p take, in KiB.
func duKB(t *testing.T, p string) int64 {
	t.Helper()
	var total int64
	must(t, filepath.Walk(p, func(_ string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	}))
	return total >> 10
}
