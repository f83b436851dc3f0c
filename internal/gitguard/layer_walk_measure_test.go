package gitguard

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestMeasureLayerWalk measures one layer snapshot of a given shape, for
// the numbers of docs/layers.md and the report (not a check: it
// asserts nothing and is skipped unless asked for). One shape a process,
// as peak RSS is the process's:
//
//	go test -c -o /tmp/gg.test ./internal/gitguard
//	SHIM_MEASURE_WALK=chain:25000 /tmp/gg.test -test.run TestMeasureLayerWalk -test.v
//
// Shapes: chain:N (a directory chain N deep, a file at its bottom),
// wide:N (N files, a thousand a directory), flat:N (N files in one
// directory), checkout:N (a baseline of N
// files, a layer that edits ten of them), spread:N (a baseline of N files,
// a layer that edits 1,000 of them, one a directory as far as they go).
func TestMeasureLayerWalk(t *testing.T) {
	spec := os.Getenv("SHIM_MEASURE_WALK")
	if spec == "" {
		t.Skip("SHIM_MEASURE_WALK=shape:N measures a layer snapshot")
	}
	shape, ns, _ := strings.Cut(spec, ":")
	n, err := strconv.Atoi(ns)
	must(t, err)
	f := newFixture(t)
	base := f.baseline
	up := filepath.Join(f.root, "layer", "upper")
	writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
	switch shape {
	case "chain":
		makeChain(t, up, "d", n, nil)
	case "wide":
		for i := 0; i < n; i++ {
			writeFile(t, filepath.Join(up, "w", strconv.Itoa(i/1000), strconv.Itoa(i)), "file "+strconv.Itoa(i)+"\n")
		}
	case "flat":
		for i := 0; i < n; i++ {
			writeFile(t, filepath.Join(up, "flat", strconv.Itoa(i)), "file "+strconv.Itoa(i)+"\n")
		}
	case "checkout":
		base = bigBaseline(t, f, n, 1000)
		for i := 0; i < 10; i++ {
			writeFile(t, filepath.Join(up, "c", strconv.Itoa(i*(n/10000+1)), strconv.Itoa(i*1000)), "edited\n")
		}
	case "spread":
		base = bigBaseline(t, f, n, 50)
		for i := 0; i < 1000; i++ {
			j := i * (n / 1000)
			writeFile(t, filepath.Join(up, "c", strconv.Itoa(j/50), strconv.Itoa(j)), "edited\n")
		}
	default:
		t.Fatalf("shape %q", shape)
	}
	g := f.guard(t, nil)
	unix.Sync()
	runtime.GC()
	must(t, os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)) // VmHWM from here
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapInuse)
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	rep, err := g.SnapshotLayer(context.Background(), 1, base, up)
	took := time.Since(start)
	close(stop)
	wg.Wait()
	runtime.ReadMemStats(&after)
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_CHILDREN, &ru)
	status, _ := os.ReadFile("/proc/self/status")
	hwm := ""
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			hwm = strings.Join(strings.Fields(l)[1:], " ")
		}
	}
	commit, notStored, types := "", 0, map[string]int{}
	if rep != nil {
		commit, notStored = rep.SnapshotCommit, len(rep.NotStored)
		for _, ns := range rep.NotStored {
			types[ns.Type]++
		}
	}
	t.Logf("MEASURE %s: %v err=%v commit=%q not_stored=%d %v | peak RSS (VmHWM) %s | heap in use peak %.1f MiB (before %.1f) | allocated %.1f MiB | largest git child RSS %d MiB",
		spec, took.Round(time.Millisecond), err, commit, notStored, types, hwm,
		float64(peak)/(1<<20), float64(before.HeapInuse)/(1<<20), float64(after.TotalAlloc-before.TotalAlloc)/(1<<20), ru.Maxrss/1024)
}

// bigBaseline makes a commit of n files (perDir a directory, below c/)
// in f's repository with one fast-import, and returns it.
func bigBaseline(t *testing.T, f *fixture, n, perDir int) string {
	t.Helper()
	var s bytes.Buffer
	fmt.Fprintf(&s, "blob\nmark :1\ndata 5\nfile\n\ncommit refs/heads/big\ncommitter t <t@t> 1 +0000\ndata 3\nbig\nfrom %s\n", f.baseline)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&s, "M 100644 :1 c/%d/%d\n", i/perDir, i)
	}
	s.WriteString("\n")
	p := filepath.Join(f.root, "big.stream")
	must(t, os.WriteFile(p, s.Bytes(), 0o644))
	in, err := os.Open(p)
	must(t, err)
	defer in.Close()
	cmd := exec.Command("/usr/bin/git", "-c", "safe.directory=*", "fast-import", "--quiet")
	cmd.Dir, cmd.Stdin, cmd.Env = f.wt, in, testEnv(os.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("fast-import: %v %s", err, out)
	}
	return tgit(t, f.wt, "rev-parse", "refs/heads/big")
}
