package main

import (
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/shimdev/shim/internal/cgroup"
)

// prewarmThreads makes the Go runtime create n OS threads now and keep them
// idle. The runtime creates a thread when every one it has is busy (in a
// blocking syscall, or locked), and a failed clone there is a fatal error,
// not an error it returns: a harness that takes every pid of the sandbox
// could crash PID 1 (`fatal error: newosproc`). Idle threads are never
// given back, so with a pool made before any harness runs, serving and
// fencing need no new thread; forks that fail (git, a new harness) fail as
// errors.
func prewarmThreads(n int) {
	var ready, release sync.WaitGroup
	ready.Add(n)
	release.Add(1)
	for i := 0; i < n; i++ {
		go func() {
			goruntime.LockOSThread() // a thread of its own while locked
			ready.Done()
			release.Wait()
			goruntime.UnlockOSThread() // back to the idle pool, not exited
		}()
	}
	ready.Wait()
	release.Done()
}

// defaultLimits turns --default-memory-max and --default-pids-max into
// limits: absolute, or a percentage of what the cgroup root may use (its
// own memory.max and pids.max where numeric, else the machine's memory and
// pid_max). A percentage keeps the rest for shim itself.
func defaultLimits(root, memory, pids string) (cgroup.Limits, error) {
	var l cgroup.Limits
	var err error
	if l.MemoryMax, err = limitValue(memory, func() int64 { return rootLimit(root, "memory.max", memTotal) }); err != nil {
		return l, fmt.Errorf("--default-memory-max: %w", err)
	}
	if l.PidsMax, err = limitValue(pids, func() int64 { return rootLimit(root, "pids.max", pidMax) }); err != nil {
		return l, fmt.Errorf("--default-pids-max: %w", err)
	}
	return l, nil
}

func limitValue(s string, whole func() int64) (int64, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		pct, err := strconv.ParseFloat(p, 64)
		if err != nil || pct < 0 || pct > 100 {
			return 0, fmt.Errorf("percentage %q must be between 0 and 100", s)
		}
		return int64(float64(whole()) * pct / 100), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a non-negative number or a percentage", s)
	}
	return n, nil
}

// rootLimit is the numeric value of file in the cgroup root (or in any
// ancestor up to the mount), else fallback().
func rootLimit(root, file string, fallback func() int64) int64 {
	for dir := root; dir != "" && dir != "/" && strings.HasPrefix(dir, "/sys/fs/cgroup"); dir = filepath.Dir(dir) {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return n
		}
	}
	return fallback()
}

func memTotal() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func pidMax() int64 {
	b, _ := os.ReadFile("/proc/sys/kernel/pid_max")
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}
