package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shimdev/shim/api"
)

// benchUID is the harness's uid in the fence benchmark (nobody), owning
// the checkouts, as the integration tests' harness.
const benchUID = 65534

// runBenchFence is `shim bench fence`: issue 27's table in one run. For
// each checkout size and each count of changed files, the fence of a
// layered generation that changed (and committed, as a retried step
// redoing its edit does) that many files spread over the tree, beside
// the composite kernel floor of the same outcome without saving anything
// (freeze, cgroup.kill until empty, unmount, mount an empty overlay
// upper, fork/exec the next process into a new cgroup). Rounds are
// interleaved over every size and count; medians are reported. Figures
// are reported, never asserted.
func runBenchFence(args []string) int {
	fs := flag.NewFlagSet("bench fence", flag.ContinueOnError)
	sizes := fs.String("sizes", "100,5000,50000,200000", "checkout sizes (files)")
	changes := fs.String("changes", "10,100,1000", "files the abandoned generation changes (only those below a size)")
	rounds := fs.Int("rounds", 5, "interleaved rounds (the median is reported), after one warm-up round")
	quick := fs.Bool("quick", false, "a CI-cheap run: --sizes 100,5000 --changes 10,100 --rounds 3")
	steps := fs.Bool("steps", false, "also the medians of every step of the fence and of the snapshot")
	baseline := fs.String("baseline", "", "also this shim binary (e.g. an older build), on checkouts of its own, interleaved with this one")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *quick {
		*sizes, *changes, *rounds = "100,5000", "10,100", 3
	}
	o := fenceBenchOptions{rounds: *rounds, steps: *steps, bins: []string{""}}
	if *baseline != "" {
		o.bins = append(o.bins, *baseline)
	}
	var err error
	if o.sizes, err = countList(*sizes); err == nil {
		o.changes, err = countList(*changes)
	}
	if err != nil || o.rounds < 1 {
		fmt.Fprintf(os.Stderr, "bench fence: bad flags: %v\n", err)
		return 2
	}
	if err := benchFence(o); err != nil {
		fmt.Fprintf(os.Stderr, "bench fence: %v\n", err)
		return 1
	}
	return 0
}

type fenceBenchOptions struct {
	sizes, changes []int
	rounds         int
	steps          bool
	bins           []string // the shim binaries measured ("": this one)
}

func countList(s string) ([]int, error) {
	var v []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		v = append(v, n)
	}
	return v, nil
}

// A fenceCase is one row of the table: a checkout size and a count of
// changed files, with its samples.
type fenceCase struct {
	box     *fenceBox
	changed int
	shim    []float64            // the announce's answer, the new harness running (ms)
	restore []float64            // the fence report's restore step (ms)
	start   []float64            // the start's own step (ms)
	floor   []float64            // the composite kernel floor (ms)
	exec    []float64            // the floor's fork/exec into a new cgroup (ms)
	idle    []float64            // shim's RSS right before the fence (KiB)
	peak    []float64            // shim's peak RSS during the fence (KiB)
	steps   map[string][]float64 // with --steps: the fence's and the snapshot's steps (ms)
	mem     map[string][]float64 // with --steps: shim's RSS split into anon and file, before and at their sampled peaks (KiB)
}

func benchFence(o fenceBenchOptions) error {
	fmt.Printf("shim bench fence: %d rounds (after a warm-up), medians; kernel %s\n", o.rounds, kernelRelease())
	var boxes []*fenceBox
	defer func() {
		for _, b := range boxes {
			b.close()
		}
	}()
	var cases []*fenceCase
	for _, n := range o.sizes {
		for _, bin := range o.bins {
			t0 := time.Now()
			b, err := newFenceBox(n, bin)
			if err != nil {
				return fmt.Errorf("checkout of %d files: %w", n, err)
			}
			boxes = append(boxes, b)
			fmt.Printf("checkout of %d files ready in %v (shim %s)\n", n, time.Since(t0).Round(time.Millisecond), b.name())
			for _, c := range o.changes {
				if c < n {
					cases = append(cases, &fenceCase{box: b, changed: c})
					b.rotation = append(b.rotation, c)
				}
			}
		}
	}
	for r := 0; r <= o.rounds; r++ {
		for _, c := range cases {
			if err := c.round(r > 0); err != nil {
				return fmt.Errorf("%d files, %d changed: %w", c.box.n, c.changed, err)
			}
		}
	}
	printFenceTable(os.Stdout, cases)
	if o.steps {
		printFenceSteps(os.Stdout, cases)
	}
	return nil
}

// round measures one fence of a generation that changed c.changed files
// and the floor beside it; timed false is the warm-up.
func (c *fenceCase) round(timed bool) error {
	b := c.box
	if err := b.running(c.changed); err != nil {
		return err
	}
	idle, err := resetPeak(b.ls.cmd.Process.Pid)
	if err != nil {
		return err
	}
	split := sampleRSS(b.ls.cmd.Process.Pid)
	t0 := time.Now()
	res, err := b.announce(b.next(c.changed))
	d := time.Since(t0)
	mem := split.stop()
	if err != nil {
		return err
	}
	peak, err := statusKB(b.ls.cmd.Process.Pid, "VmHWM:")
	if err != nil {
		return err
	}
	if len(res.Fenced) != 1 || res.Fenced[0].SnapshotCommit == "" {
		return fmt.Errorf("announce %d: no snapshot in %+v", b.gen, res.Fenced)
	}
	floor, exec, err := b.floor.measure(c.changed)
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	if timed {
		c.shim = append(c.shim, ms(d))
		c.restore = append(c.restore, res.Fenced[0].DurationsMS["restore"])
		c.start = append(c.start, res.DurationsMS["start"])
		c.floor, c.exec = append(c.floor, floor), append(c.exec, exec)
		c.idle, c.peak = append(c.idle, float64(idle)), append(c.peak, float64(peak))
		c.addSteps(res.Fenced[0])
		if c.mem == nil {
			c.mem = map[string][]float64{}
		}
		for k, v := range mem {
			c.mem[k] = append(c.mem[k], float64(v))
		}
	}
	return nil
}

// An rssSampler reads shim's RssAnon and RssFile every millisecond while
// a fence runs and keeps their highest values: VmHWM says how high the
// RSS went, not whether the heap or mapped files' pages made it.
type rssSampler struct {
	pid  int
	done chan struct{}
	got  chan map[string]int
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{pid: pid, done: make(chan struct{}), got: make(chan map[string]int, 1)}
	m := map[string]int{}
	s.read(m, "before")
	go func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.done:
				s.read(m, "after")
				s.got <- m
				return
			case <-t.C:
				s.read(m, "peak")
			}
		}
	}()
	return s
}

// read records RssAnon and RssFile under "anon "+what and "file "+what
// ("peak": the highest seen).
func (s *rssSampler) read(m map[string]int, what string) {
	for _, k := range []string{"RssAnon:", "RssFile:"} {
		v, err := statusKB(s.pid, k)
		if err != nil {
			continue
		}
		key := strings.ToLower(strings.TrimPrefix(k, "Rss"))
		key = strings.TrimSuffix(key, ":") + " " + what
		if what != "peak" || v > m[key] {
			m[key] = v
		}
	}
}

func (s *rssSampler) stop() map[string]int {
	if s == nil {
		return nil
	}
	close(s.done)
	return <-s.got
}

// resetPeak resets the peak RSS the kernel keeps for pid (clear_refs 5)
// and returns its RSS now (KiB).
func resetPeak(pid int) (int, error) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return 0, err
	}
	return statusKB(pid, "VmRSS:")
}

func statusKB(pid int, key string) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, key); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", key, pid)
}

func printFenceTable(w io.Writer, cases []*fenceCase) {
	fmt.Fprintf(w, "\n| shim | checkout | changed | floor (ms) | shim (ms) | shim / floor | restore (ms) | start (ms) | fork/exec (ms) | start / fork/exec | RSS idle / before / peak (MiB) | peak / idle |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range cases {
		f, s, st, ex := median(c.floor), median(c.shim), median(c.start), median(c.exec)
		idle, before, peak := float64(c.box.idleKB)/1024, median(c.idle)/1024, median(c.peak)/1024
		fmt.Fprintf(w, "| %s | %d | %d | %.1f | %.1f | %.1fx | %.1f | %.1f | %.2f | %.1fx | %.1f / %.1f / %.1f | %.2fx |\n",
			c.box.name(), c.box.n, c.changed, f, s, s/f, median(c.restore), st, ex, st/ex, idle, before, peak, peak/idle)
	}
}

// announce fences the running generation and starts the next one, which
// changes changed files of the checkout (for the next round of that case).
func (b *fenceBox) announce(changed int) (*api.StartResult, error) {
	b.gen++
	b.changed = changed
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return b.ls.client.Start(ctx, b.request(b.gen, changed))
}

// running makes sure the generation that runs has changed changed files
// (and committed them): it announces one when the one running changed
// another count, and waits for its harness's ready mark.
func (b *fenceBox) running(changed int) error {
	if b.gen == 0 || b.changed != changed {
		if _, err := b.announce(changed); err != nil {
			return err
		}
	}
	mark := filepath.Join(b.out, "ready-"+strconv.FormatUint(b.gen, 10))
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if _, err := os.Stat(mark); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("generation %d's harness did not make its edits (no %s)", b.gen, mark)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (c *fenceCase) addSteps(f api.FenceReport) {
	if c.steps == nil {
		c.steps = map[string][]float64{}
	}
	for k, v := range f.DurationsMS {
		c.steps[k] = append(c.steps[k], v)
	}
	if f.Worktree != nil {
		for k, v := range f.Worktree.DurationsMS {
			c.steps["snapshot."+k] = append(c.steps["snapshot."+k], v)
		}
	}
}

func printFenceSteps(w io.Writer, cases []*fenceCase) {
	fmt.Fprintf(w, "\nsteps (medians, ms)\n")
	for _, c := range cases {
		keys := make([]string, 0, len(c.steps))
		for k := range c.steps {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "%s, %d files, %d changed:", c.box.name(), c.box.n, c.changed)
		for _, k := range keys {
			fmt.Fprintf(w, " %s %.1f", k, median(c.steps[k]))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\nshim's RSS by kind, sampled every ms (medians, MiB): idle (before any generation) / before the fence / highest during it / after it\n")
	for _, c := range cases {
		fmt.Fprintf(w, "%s, %d files, %d changed:", c.box.name(), c.box.n, c.changed)
		for _, k := range []string{"anon", "file"} {
			idle := c.box.idleAnon
			if k == "file" {
				idle = c.box.idleFile
			}
			fmt.Fprintf(w, " %s %.1f / %.1f / %.1f / %.1f", k, float64(idle)/1024, median(c.mem[k+" before"])/1024, median(c.mem[k+" peak"])/1024, median(c.mem[k+" after"])/1024)
		}
		fmt.Fprintln(w)
	}
}
