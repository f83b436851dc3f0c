package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// demoHarness is generation 1's "agent": it edits and commits in the
// checkout, starts a setsid daemon, a double-forked child and a loop that
// keeps forking, and keeps working until it is fenced.
const demoHarness = `
setsid sh -c 'while :; do sleep 1; done' &
sh -c 'sleep 1000 &' &
sh -c 'i=0; while [ $i -lt 2000 ]; do sleep 1000 & i=$((i+1)); sleep 0.02; done; wait' &
echo "a half-finished change" >> README.md
git add README.md && git commit -qm "wip: gen 1 local commit"
mkdir -p scratch && echo "untracked notes" > scratch/notes.txt
echo "uncommitted edit" >> main.go
touch .ready
while :; do date >> progress.log; sleep 0.1; done
`

const demoUsage = `usage: shim demo
  As root: starts shim as PID 1 of fresh pid and mount namespaces (a
  temporary runtime dir and cgroup subtree), runs a harness that escapes
  in every way it can, fences it with a newer generation, prints the fence
  report and recovers its edits with plain git; then removes everything it
  made, also when it is interrupted (SIGINT, SIGTERM) or its output is
  closed (SIGPIPE).
`

// runDemo shows the seed scenario end to end on this machine: a harness
// with escaping children and abandoned edits, fenced by a newer generation.
// A signal that would end it (SIGINT, SIGTERM, SIGPIPE: `shim demo | head`)
// ends it the same way, through its cleanup: no cgroup, shim or temporary
// dir is left behind.
func runDemo(args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(demoUsage)
			return 0
		}
		fmt.Fprint(os.Stderr, demoUsage)
		return 2
	}
	if err := needRoot(os.Geteuid()); err != nil {
		fmt.Fprintf(os.Stderr, "shim demo: %v\n", err)
		return 1
	}
	var cl cleanups
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGPIPE)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- demo(ctx, &cl) }()
	select {
	case err := <-done:
		cl.run()
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo failed: %v\n", err)
			return 1
		}
		return 0
	case sig := <-sigs:
		cancel()
		cl.run() // what demo made so far
		// It stops at its next step (its context is cancelled, its shim
		// gone) and undoes at once whatever it made meanwhile.
		select {
		case <-done:
		case <-time.After(time.Minute):
		}
		fmt.Fprintf(os.Stderr, "demo stopped by %v; everything it made is removed\n", sig)
		return 128 + int(sig.(syscall.Signal))
	}
}

// cleanups undoes what the demo made, newest first, once; what is added
// after that is undone at once.
type cleanups struct {
	mu   sync.Mutex
	fns  []func()
	done bool
}

func (c *cleanups) add(fn func()) {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		fn()
		return
	}
	c.fns = append(c.fns, fn)
	c.mu.Unlock()
}

func (c *cleanups) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns, c.done = nil, true
}

func demo(ctx context.Context, cl *cleanups) error {
	logf, err := os.CreateTemp("", "shim-demo-log-")
	if err != nil {
		return err
	}
	cl.add(func() { logf.Close(); os.Remove(logf.Name()) })

	c, err := demoShim(ctx, cl, logf)
	if err != nil {
		return err
	}

	work, err := os.MkdirTemp("", "shim-demo-repo-")
	if err != nil {
		return err
	}
	cl.add(func() { os.RemoveAll(work) })
	wt := filepath.Join(work, "checkout")
	baseline, err := demoRepo(work, wt)
	if err != nil {
		return fmt.Errorf("make the demo repository: %w", err)
	}
	step("a checkout at %s; last pushed commit (the baseline) %s", wt, baseline[:12])

	env := []string{"GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@example.invalid",
		"GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@example.invalid", "HOME=" + work}
	step("announcing generation 1: the agent edits, commits, forks daemons and keeps working")
	r1, err := c.Start(ctx, api.StartRequest{Generation: 1, Command: []string{"sh", "-c", demoHarness},
		Worktree: wt, Baseline: baseline, Env: env})
	if err != nil {
		return err
	}
	fmt.Printf("    generation 1: pid %d in %s\n", r1.Pid, r1.Cgroup)
	deadline := time.Now().Add(15 * time.Second)
	for countCgroupProcs(r1.Cgroup) < 40 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("generation 1 did not get going")
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("    generation 1 now has %d processes\n", countCgroupProcs(r1.Cgroup))

	step("the supervisor restarts and announces generation 2")
	r2, err := c.Start(ctx, api.StartRequest{Generation: 2, Command: []string{"sh", "-c", "git status --short > status.txt; sleep 1000"},
		Worktree: wt, Baseline: baseline, Env: env})
	if err != nil {
		return err
	}
	for _, rep := range r2.Fenced {
		printReport(rep)
	}
	fmt.Printf("    generation 2: pid %d in %s\n", r2.Pid, r2.Cgroup)

	if err := showRecovery(wt, baseline, r2.Fenced); err != nil {
		return err
	}

	step("announcing generation 1 again (a late retry of the abandoned call)")
	_, err = c.Start(ctx, api.StartRequest{Generation: 1, Command: []string{"true"}})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != api.CodeStaleGeneration {
		return fmt.Errorf("generation 1 should be refused as stale, got %v", err)
	}
	fmt.Printf("    refused: %s: %s\n", ce.Code, ce.Message)
	return nil
}

// demoShim starts shim as PID 1 of new namespaces (stopped by cl) and
// waits for its start-up probe.
func demoShim(ctx context.Context, cl *cleanups, logf *os.File) (*client.Client, error) {
	step("starting shim as PID 1 of new pid and mount namespaces")
	ls, err := startLocalShim("demo", logf)
	if err != nil {
		return nil, err
	}
	cl.add(func() {
		step("cleaning up: shim stopped, cgroups %s and runtime dir removed", ls.cgroupRoot)
		ls.close()
	})
	c := ls.client
	st, err := c.Status(ctx)
	for i := 0; err == nil && st.Isolation.Mode == "probing" && i < 300; i++ {
		time.Sleep(100 * time.Millisecond) // the start-up probe; the first start would wait for it too
		st, err = c.Status(ctx)
	}
	if err != nil {
		return nil, err
	}
	fmt.Printf("    runtime dir %s, cgroup root %s, mode %s\n", ls.runtimeDir, ls.cgroupRoot, st.Mode)
	fmt.Printf("    isolation %s%s\n", st.Isolation.Mode, paren(st.Isolation.Reason))
	return c, nil
}

func printReport(rep api.FenceReport) {
	fmt.Printf("    fence report for generation %d (%s before the fence):\n", rep.Generation, rep.StateBefore)
	fmt.Printf("      killed %d processes, %d survivors\n", rep.Killed, rep.Survivors)
	if rep.Cut != nil && (rep.Cut.CredentialsRevoked > 0 || rep.Cut.TunnelsClosed > 0 || rep.Cut.LinkDeleted) {
		fmt.Printf("      cut: %d credentials revoked, %d tunnels closed, link deleted %v\n", rep.Cut.CredentialsRevoked, rep.Cut.TunnelsClosed, rep.Cut.LinkDeleted)
	}
	if rep.SnapshotRef != "" {
		fmt.Printf("      abandoned edits saved as %s = %s (baseline %s)\n", rep.SnapshotRef, short(rep.SnapshotCommit), short(rep.Baseline))
	}
	if w := rep.Worktree; w != nil && w.Isolation == "layers" {
		fmt.Printf("      the snapshot is its worktree layer; the checkout was never written, so nothing was reset\n")
	}
	if l := rep.Layer; l != nil && len(l.Paths) == 0 {
		fmt.Printf("      it wrote nothing outside the worktree (its root layer is empty)\n")
	} else if l != nil {
		fmt.Printf("      outside the worktree it wrote %d paths (%d bytes), kept in its root layer %s: %s\n", len(l.Paths), l.Bytes, l.Dir, strings.Join(l.Paths, " "))
	}
	keys := make([]string, 0, len(rep.DurationsMS))
	for k := range rep.DurationsMS {
		keys = append(keys, k)
	}
	order := map[string]int{"freeze": 0, "cut": 1, "kill": 2, "persist": 3, "restore": 4, "start": 5, "total": 6}
	sort.Slice(keys, func(i, j int) bool { return order[keys[i]] < order[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", k, rep.DurationsMS[k]))
	}
	fmt.Printf("      steps: %s\n", strings.Join(parts, ", "))
}

func short(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("      " + l + "\n")
	}
	return b.String()
}

// step prints the title of one step of the demo.
func step(format string, a ...any) { fmt.Printf("\n==> "+format+"\n", a...) }

// showRecovery is the demo's claim: gen 1 was fenced with no survivor, its
// edits are in a snapshot ref that plain git reads, and the worktree is
// back at the baseline. Anything else fails the demo.
func showRecovery(wt, baseline string, fenced []api.FenceReport) error {
	if len(fenced) != 1 || fenced[0].Survivors != 0 || fenced[0].SnapshotRef == "" {
		return fmt.Errorf("generation 1 should be fenced with no survivor and its edits in a snapshot ref, got %+v", fenced)
	}
	ref := fenced[0].SnapshotRef
	step("recovering gen 1's edits with plain git: git diff --stat %s %s", baseline[:12], ref)
	//shimlint:allow onereaper: shim demo runs as a command, not as PID 1
	//shimlint:allow hardgit: the demo's own checkout, shown with plain git as a user would
	out, err := exec.Command("git", "-C", wt, "diff", "--stat", baseline, ref).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		return fmt.Errorf("git diff %s %s shows no edits of generation 1: %v %s", baseline, ref, err, out)
	}
	fmt.Print(indent(string(out)))
	//shimlint:allow onereaper: shim demo runs as a command, not as PID 1
	//shimlint:allow hardgit: the demo's own checkout, shown with plain git as a user would
	out, err = exec.Command("git", "-C", wt, "status", "--short").CombinedOutput()
	if err != nil {
		return fmt.Errorf("git status: %v %s", err, out)
	}
	fmt.Printf("    worktree now (git status --short): %q\n", strings.TrimSpace(string(out)))
	return nil
}

// demoRepo makes a bare origin and a checkout with one pushed commit.
func demoRepo(work, wt string) (string, error) {
	origin := filepath.Join(work, "origin.git")
	run := func(dir string, args ...string) (string, error) {
		//shimlint:allow hardgit: the demo makes its own repository, before any harness runs
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work, "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=supervisor", "GIT_AUTHOR_EMAIL=s@example.invalid",
			"GIT_COMMITTER_NAME=supervisor", "GIT_COMMITTER_EMAIL=s@example.invalid"}
		//shimlint:allow onereaper: shim demo runs as a command, not as PID 1
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out)), nil
	}
	if _, err := run(work, "init", "-q", "--bare", "-b", "main", origin); err != nil {
		return "", err
	}
	if _, err := run(work, "clone", "-q", origin, wt); err != nil {
		return "", err
	}
	os.WriteFile(filepath.Join(wt, "README.md"), []byte("# demo\n"), 0o644)
	os.WriteFile(filepath.Join(wt, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644)
	os.WriteFile(filepath.Join(wt, ".gitignore"), []byte("progress.log\n.ready\nstatus.txt\n"), 0o644)
	for _, args := range [][]string{{"checkout", "-q", "-b", "main"}, {"add", "-A"}, {"commit", "-qm", "initial"}, {"push", "-q", "origin", "main"}} {
		if _, err := run(wt, args...); err != nil {
			return "", err
		}
	}
	return run(wt, "rev-parse", "HEAD")
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}
