package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shimdev/shim/api"
)

// runBench measures, in one run on this machine, what the fence costs next
// to the baseline it beats: kill-to-empty against a bare cgroup.kill (the
// kernel floor), fence latency, reaping throughput against tini, idle RSS
// and binary size. Figures are reported, never asserted.
func runBench(args []string) int {
	if len(args) > 0 && args[0] == "fence" {
		return runBenchFence(args[1:])
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	rounds := fs.Int("rounds", 5, "repetitions of each measurement (the median is reported)")
	orphans := fs.Int("orphans", 5000, "orphans for the reaping throughput")
	soak := fs.Int("soak", 0, "instead: a soak of this many consecutive generations on one sandbox (figures every --every)")
	every := fs.Int("every", 100, "with --soak: generations per line of figures")
	bin := fs.String("shim", "", "with --soak: the shim binary under test (default this one), e.g. an older build")
	initArgs := fs.String("init-args", "", "with --soak: extra flags of its shim init, space-separated")
	steps := fs.Bool("steps", false, "with --soak: also the p50 of every fence step")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *soak > 0 {
		if *every <= 0 {
			fmt.Fprintln(os.Stderr, "bench: --every must be positive")
			return 2
		}
		if err := runSoak(soakOptions{n: *soak, every: *every, bin: *bin, args: strings.Fields(*initArgs), steps: *steps}); err != nil {
			fmt.Fprintf(os.Stderr, "bench: soak: %v\n", err)
			return 1
		}
		return 0
	}
	if err := bench(*rounds, *orphans); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	return 0
}

func bench(rounds, orphans int) error {
	ls, err := startLocalShim("bench", io.Discard, "--log-level", "warn")
	if err != nil {
		return err
	}
	defer ls.close()
	ctx := context.Background()
	self, _ := os.Executable()
	fmt.Printf("shim bench: %d rounds, medians; kernel %s\n\n", rounds, kernelRelease())
	fmt.Printf("%-44s %12s %12s %8s\n", "measurement", "shim", "baseline", "ratio")

	// Kill-to-empty and fence latency, through real announcements.
	gen := uint64(0)
	for _, n := range []int{100, 1000} {
		var kill, fence, floor []float64
		for r := 0; r < rounds; r++ {
			gen++
			res, err := ls.client.Start(ctx, api.StartRequest{Generation: gen, Command: spawnSleepers(n)})
			if err != nil {
				return err
			}
			if err := waitProcs(res.Cgroup, n+1); err != nil {
				return err
			}
			gen++
			t0 := time.Now()
			r2, err := ls.client.Start(ctx, api.StartRequest{Generation: gen, Command: []string{"sleep", "1000"}})
			if err != nil {
				return err
			}
			fence = append(fence, ms(time.Since(t0)))
			kill = append(kill, r2.Fenced[0].DurationsMS["kill"])
			f, err := kernelFloor(n)
			if err != nil {
				return err
			}
			floor = append(floor, f)
		}
		row(fmt.Sprintf("kill-to-empty, %d processes (ms)", n), median(kill), median(floor), "bare cgroup.kill")
		if n == 100 {
			row("fence latency, 100 processes (ms)", median(fence), 0, "announce -> new harness running")
		}
	}

	// Reaping throughput: the same orphan burst under shim and under tini.
	gen++
	shimRate, err := shimReapRate(ls, gen, orphans)
	if err != nil {
		return err
	}
	tiniRate, err := tiniReapRate(orphans)
	if err != nil {
		fmt.Printf("(tini baseline unavailable: %v)\n", err)
	}
	row(fmt.Sprintf("reaping, %d orphans (orphans/s)", orphans), shimRate, tiniRate, "tini as PID 1")

	st, err := os.Stat(self)
	if err == nil {
		fmt.Printf("%-44s %12.1f\n", "binary size (MiB)", float64(st.Size())/(1<<20))
	}
	if rss, err := vmRSS(ls.cmd.Process.Pid); err == nil {
		fmt.Printf("%-44s %12.1f\n", "shim RSS after the runs (MiB)", float64(rss)/1024)
	}
	idle, err := startLocalShim("bench-idle", io.Discard, "--log-level", "warn")
	if err == nil {
		time.Sleep(500 * time.Millisecond)
		if rss, err := vmRSS(idle.cmd.Process.Pid); err == nil {
			fmt.Printf("%-44s %12.1f\n", "shim idle RSS (MiB)", float64(rss)/1024)
		}
		idle.close()
	}
	return nil
}

func row(name string, v, base float64, what string) {
	if base > 0 {
		fmt.Printf("%-44s %12.1f %12.1f %7.2fx  (%s)\n", name, v, base, v/base, what)
	} else {
		fmt.Printf("%-44s %12.1f %12s %8s  (%s)\n", name, v, "-", "", what)
	}
}

// spawnSleepers is a harness with n sleeping children.
func spawnSleepers(n int) []string {
	return []string{"sh", "-c", fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep 1000 & i=$((i+1)); done; wait", n)}
}

func waitProcs(cgroup string, n int) error {
	deadline := time.Now().Add(60 * time.Second)
	for countCgroupProcs(cgroup) < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s reached %d of %d processes", cgroup, countCgroupProcs(cgroup), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// kernelFloor measures a bare cgroup.kill of n processes and the wait for
// "populated 0", in a cgroup of its own, outside shim.
func kernelFloor(n int) (float64, error) {
	mnt, err := cgroup2Mount()
	if err != nil {
		return 0, err
	}
	b := make([]byte, 4)
	rand.Read(b)
	dir := filepath.Join(mnt, "shim-bench-floor-"+hex.EncodeToString(b))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return 0, err
	}
	defer removeCgroupTree(dir)
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(spawnSleepers(n)[0], spawnSleepers(n)[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Setsid: true}
	err = cmd.Start()
	syscall.Close(fd)
	if err != nil {
		return 0, err
	}
	// The floor's own children are reaped by this process; orphans would go
	// to the machine's init, which is why each sleeper stays a child of sh.
	//shimlint:allow onereaper: shim bench runs as a command, not as PID 1
	defer cmd.Wait()
	if err := waitProcs(dir, n+1); err != nil {
		return 0, err
	}
	t0 := time.Now()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		return 0, err
	}
	for {
		ev, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			return 0, err
		}
		if strings.Contains(string(ev), "populated 0") {
			return ms(time.Since(t0)), nil
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// orphanBurst makes n orphans that exit at once and then waits until none
// is left unreaped; it prints its own elapsed nanoseconds, so shim and tini
// are timed by the same clock on the same work.
func orphanBurst(n int) string {
	return fmt.Sprintf(`t0=$(date +%%s%%N)
i=0; while [ $i -lt %d ]; do ( /bin/true & ); i=$((i+1)); done
while grep -qs '^State:.Z' /proc/[0-9]*/status; do :; done
echo $(( $(date +%%s%%N) - t0 ))`, n)
}

func shimReapRate(ls *localShim, gen uint64, n int) (float64, error) {
	ctx := context.Background()
	res, err := ls.client.Start(ctx, api.StartRequest{Generation: gen, Command: []string{"sh", "-c", orphanBurst(n)}})
	if err != nil {
		return 0, err
	}
	exit, err := ls.client.Wait(ctx, res.Generation)
	if err != nil || exit.ExitCode != 0 {
		return 0, fmt.Errorf("orphan burst under shim: %v %+v", err, exit)
	}
	out, err := os.ReadFile(filepath.Join(ls.runtimeDir, "gen", itoa(gen), "stdout"))
	if err != nil {
		return 0, err
	}
	return rate(n, string(out))
}

func tiniReapRate(n int) (float64, error) {
	tini, err := exec.LookPath("tini")
	if err != nil {
		return 0, err
	}
	cmd := exec.Command("unshare", "--pid", "--fork", "--mount-proc", tini, "-s", "--", "sh", "-c", orphanBurst(n))
	//shimlint:allow onereaper: shim bench runs as a command, not as PID 1
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("tini run: %v", err)
	}
	return rate(n, string(out))
}

func rate(n int, out string) (float64, error) {
	ns, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil || ns <= 0 {
		return 0, fmt.Errorf("bad timing output %q", out)
	}
	return float64(n) / (ns / 1e9), nil
}

func vmRSS(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strconv.Atoi(strings.Fields(l)[1])
		}
	}
	return 0, fmt.Errorf("no VmRSS")
}

func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return "?"
	}
	var b []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64{}, v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
