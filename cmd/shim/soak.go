package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/sandbox"
)

// soakUID owns the soak's checkout and runs its harnesses (nobody on Debian).
const soakUID = 65534

// soakFiles is the size of the soak's checkout.
const soakFiles = 2000

// soakHarness is one generation of the soak: on the checkout it edits 20
// tracked files and commits them once, creates 5 untracked files, starts a
// setsid daemon and a loop that keeps forking, writes 1 MiB to stdout, and
// then either exits on its own (every third generation) or keeps running
// until the next announcement fences it. The marker outside the worktree
// tells the driver the work is done.
func soakHarness(gen uint64, out string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "set -e\nG=%d\n", gen)
	b.WriteString("setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &\n")
	b.WriteString("sh -c 'while :; do sleep 0.05; done' </dev/null >/dev/null 2>&1 &\n")
	for j := 0; j < 20; j++ {
		i := (int(gen)*20 + j) % soakFiles
		fmt.Fprintf(&b, "echo \"edit of generation $G\" >> %s\n", soakPath(i))
	}
	b.WriteString("git commit -qam \"generation $G\"\n")
	for k := 0; k < 5; k++ {
		fmt.Fprintf(&b, "echo \"new in generation $G\" > new-$G-%d.txt\n", k)
	}
	b.WriteString("head -c 1048576 /dev/zero\n")
	fmt.Fprintf(&b, "touch %s/ready-$G\n", out)
	if gen%3 == 0 {
		b.WriteString("exit 0\n")
	} else {
		b.WriteString("exec sleep 100000\n")
	}
	return b.String()
}

func soakPath(i int) string { return fmt.Sprintf("src/d%02d/f%04d.txt", i/100, i) }

// soakOptions configure runSoak.
type soakOptions struct {
	n, every int
	bin      string   // the shim binary under test ("" this one)
	args     []string // extra flags of its shim init
	steps    bool     // print the p50 of every fence step too
}

// soakWindow collects the figures of one window of generations.
type soakWindow struct {
	fence, restore, announce, maintain []float64
	pruned, full, killed, survivors    int
	steps                              map[string][]float64
}

// runSoak announces o.n consecutive generations on one sandbox, each
// fencing the one before, and every o.every generations prints the fence
// time (p50/p99 of the fence reports' total, and of their restore step),
// the announcement's latency, the runtime dir's and the repository's size,
// the snapshot refs kept and shim's RSS. It fails on the first failed
// fence or survivor.
func runSoak(o soakOptions) error {
	bin := o.bin
	if bin == "" {
		bin, _ = os.Executable()
	}
	work, err := os.MkdirTemp("", "shim-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	wt, out, home := filepath.Join(work, "wt"), filepath.Join(work, "out"), filepath.Join(work, "home")
	if err := soakDirs(work, out, home); err != nil {
		return err
	}
	t0 := time.Now()
	baseline, err := soakRepo(work, wt)
	if err != nil {
		return fmt.Errorf("make the soak repository: %w", err)
	}
	fmt.Printf("shim soak: %d generations of %s, a %d-file checkout (made in %.1fs); kernel %s\n", o.n, bin, soakFiles,
		time.Since(t0).Seconds(), kernelRelease())
	args := []string{"--log-level", "warn"}
	if self, err := os.Executable(); err == nil && self == bin {
		// The harness reports through out/ (outside its worktree): with
		// layers that is a shared path. (An older binary, --shim, may not
		// know the flag, nor need it.)
		args = append(args, "--persist", out)
	}
	sb, err := sandbox.Start(sandbox.Options{Bin: bin, Name: "soak", Args: append(args, o.args...), Out: io.Discard})
	if err != nil {
		return err
	}
	defer func() { sb.Stop(15 * time.Second); sb.Close() }()
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + home, "GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@example.invalid",
		"GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@example.invalid"}
	fmt.Printf("\n%-11s %9s %9s %11s %12s %12s %10s %10s %6s %8s\n", "generations", "fence p50", "fence p99", "restore p50",
		"maintain p50", "announce p50", "runtime MB", "repo MB", "refs", "RSS MiB")
	var w, all soakWindow
	from := uint64(1)
	start := time.Now()
	for gen := uint64(1); gen <= uint64(o.n); gen++ {
		ta := time.Now()
		res, err := sb.Client.Start(context.Background(), api.StartRequest{Generation: gen, Command: []string{"sh", "-c", soakHarness(gen, out)},
			User: fmt.Sprintf("%d:%d", soakUID, soakUID), Cwd: wt, Env: env, Worktree: wt, Baseline: baseline})
		if err != nil {
			return fmt.Errorf("generation %d: %w", gen, err)
		}
		if err := w.add(gen, res.Fenced, ms(time.Since(ta))); err != nil {
			return err
		}
		if err := soakStep(sb, out, gen); err != nil {
			return err
		}
		if gen%uint64(o.every) == 0 || gen == uint64(o.n) {
			rss, _ := vmRSS(sb.Cmd.Process.Pid)
			fmt.Printf("%5d-%-5d %9.1f %9.1f %11.1f %12.1f %12.1f %10.1f %10.1f %6d %8.1f\n", from, gen,
				pct(w.fence, 50), pct(w.fence, 99), pct(w.restore, 50), pct(w.maintain, 50), pct(w.announce, 50),
				mb(dirSize(sb.RuntimeDir)), mb(dirSize(filepath.Join(wt, ".git"))), countSnapshotRefs(wt), float64(rss)/1024)
			if o.steps {
				fmt.Printf("            p50 of each step: %s\n", stepsLine(w.steps))
			}
			all.fence = append(all.fence, w.fence...)
			all.pruned, all.full, all.killed, all.survivors = all.pruned+w.pruned, all.full+w.full, all.killed+w.killed, all.survivors+w.survivors
			w, from = soakWindow{}, gen+1
		}
	}
	fmt.Printf("\n%d generations in %s; %d processes killed, %d survivors; fence p50 over all %.1f ms; %d snapshot refs pruned, %d full repacks\n",
		o.n, time.Since(start).Round(time.Second), all.killed, all.survivors, pct(all.fence, 50), all.pruned, all.full)
	return nil
}

// soakDirs makes the soak's work dir traversable and its harness's out/
// and home/ its own.
func soakDirs(work string, dirs ...string) error {
	if err := os.Chmod(work, 0o755); err != nil {
		return err
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
		if err := os.Chown(d, soakUID, soakUID); err != nil {
			return err
		}
	}
	return nil
}

// add records what generation gen's announcement fenced (its latency ann,
// counted from the second generation on); a failed fence or a survivor
// ends the soak.
func (w *soakWindow) add(gen uint64, fenced []api.FenceReport, ann float64) error {
	for _, f := range fenced {
		if f.Error != nil || f.Survivors != 0 {
			return fmt.Errorf("generation %d's fence of %d: survivors %d, error %v", gen, f.Generation, f.Survivors, f.Error)
		}
		if w.steps == nil {
			w.steps = map[string][]float64{}
		}
		for k, v := range f.DurationsMS {
			w.steps[k] = append(w.steps[k], v)
		}
		w.killed += f.Killed
		w.survivors += f.Survivors
		w.fence = append(w.fence, f.DurationsMS["total"])
		w.restore = append(w.restore, f.DurationsMS["restore"])
		if f.Worktree != nil && f.Worktree.Maintenance != nil {
			m := f.Worktree.Maintenance
			w.maintain = append(w.maintain, maintainMS(f))
			w.pruned += len(m.SnapshotsPruned)
			if m.Repack == "full" {
				w.full++
			}
		}
	}
	if gen > 1 {
		w.announce = append(w.announce, ann)
	}
	return nil
}

// soakStep waits for generation gen's harness to be ready, and every third
// one to exit on its own: the next announcement then fences an exited
// generation.
func soakStep(sb *sandbox.Sandbox, out string, gen uint64) error {
	if err := waitFile(filepath.Join(out, "ready-"+itoa(gen)), 120*time.Second); err != nil {
		return fmt.Errorf("generation %d: %w", gen, err)
	}
	os.Remove(filepath.Join(out, "ready-"+itoa(gen)))
	if gen%3 == 0 {
		return waitExited(context.Background(), sb, gen)
	}
	return nil
}

func stepsLine(steps map[string][]float64) string {
	keys := make([]string, 0, len(steps))
	for k := range steps {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f", k, pct(steps[k], 50)))
	}
	return strings.Join(parts, ", ")
}

// soakRepo makes the checkout: soakFiles files in 20 directories, one
// commit (the baseline), owned by soakUID.
func soakRepo(work, wt string) (string, error) {
	for i := 0; i < soakFiles; i++ {
		p := filepath.Join(wt, soakPath(i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		body := fmt.Sprintf("file %d\n%s\n", i, strings.Repeat("some content of a source file\n", 10))
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(wt, ".gitignore"), []byte("*.log\n"), 0o644); err != nil {
		return "", err
	}
	run := func(args ...string) (string, error) {
		//shimlint:allow hardgit: the soak makes its own repository, before any harness runs
		cmd := exec.Command("git", args...)
		cmd.Dir = wt
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + work, "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=supervisor", "GIT_AUTHOR_EMAIL=s@example.invalid",
			"GIT_COMMITTER_NAME=supervisor", "GIT_COMMITTER_EMAIL=s@example.invalid"}
		//shimlint:allow onereaper: shim bench --soak runs as a command, not as PID 1
		b, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, b)
		}
		return strings.TrimSpace(string(b)), nil
	}
	for _, a := range [][]string{{"init", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-qm", "baseline"}} {
		if _, err := run(a...); err != nil {
			return "", err
		}
	}
	head, err := run("rev-parse", "HEAD")
	if err != nil {
		return "", err
	}
	err = filepath.WalkDir(wt, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, soakUID, soakUID)
	})
	return head, err
}

func waitFile(p string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", p, d)
		}
		time.Sleep(5 * time.Millisecond) // polling a file the harness writes
	}
}

// waitExited waits until generation gen's harness has exited.
func waitExited(ctx context.Context, sb *sandbox.Sandbox, gen uint64) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		rec, err := sb.Client.Generation(ctx, gen)
		if err == nil && rec.Exit != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("generation %d did not exit on its own (%v)", gen, err)
		}
		time.Sleep(5 * time.Millisecond) // polling the status
	}
}

func pct(v []float64, p int) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64{}, v...)
	sort.Float64s(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

// dirSize is the disk space used below p (allocated blocks).
func dirSize(p string) int64 {
	var n int64
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			} else {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

func mb(n int64) float64 { return float64(n) / 1e6 }

// countSnapshotRefs counts refs/shim/abandoned/* (loose and packed),
// reading the files without running git.
func countSnapshotRefs(wt string) int {
	gd := filepath.Join(wt, ".git")
	seen := map[string]bool{}
	filepath.WalkDir(filepath.Join(gd, "refs", "shim", "abandoned"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.HasSuffix(p, ".lock") {
			seen[strings.TrimPrefix(p, gd+"/")] = true
		}
		return nil
	})
	if b, err := os.ReadFile(filepath.Join(gd, "packed-refs")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 2 && strings.HasPrefix(f[1], "refs/shim/abandoned/") {
				seen[f[1]] = true
			}
		}
	}
	return len(seen)
}

// maintainMS is how long the maintenance f reports took: inside the fence
// (scan), or between the fences (layers).
func maintainMS(f api.FenceReport) float64 {
	if d, ok := f.DurationsMS["maintain"]; ok {
		return d
	}
	return f.Worktree.Maintenance.DurationsMS["background"]
}
