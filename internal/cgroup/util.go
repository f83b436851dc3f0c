package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// writeFile writes one value to an existing cgroup control file. Unlike
// os.WriteFile it never creates or truncates, so a missing file is ENOENT.
func writeFile(path, val string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString(val)
	cerr := f.Close()
	if werr != nil {
		return fmt.Errorf("write %q to %s: %w", val, path, werr)
	}
	return cerr
}

// readPids parses a cgroup.procs file. A missing file (cgroup removed)
// reads as empty: a removed cgroup holds no process.
func readPids(file string) ([]int, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", file, err)
		}
		pids = append(pids, n)
	}
	return pids, nil
}

// subdirs lists the directories (child cgroups) of dir.
func subdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// treePids returns the live processes of dir and all its descendant
// cgroups (a harness may create sub-cgroups in its own group), sorted.
// The kernel already leaves out processes that exited (zombies waiting for
// shim's reaper): they are unlinked from their cgroup at exit and no longer
// count for "populated".
func treePids(dir string) ([]int, error) {
	var all []int
	var walk func(string) error
	walk = func(d string) error {
		pids, err := readPids(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			return err
		}
		all = append(all, pids...)
		kids, err := subdirs(d)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		for _, k := range kids {
			if err := walk(filepath.Join(d, k)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(dir); err != nil {
		return nil, err
	}
	sort.Ints(all)
	return all, nil
}

// procStat returns the state letter and parent pid of a process from
// /proc/<pid>/stat, as seen in our pid namespace (ppid 0: the parent is
// outside it).
func procStat(pid int) (state byte, ppid int, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// comm may hold spaces and parentheses: the fields follow the last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err
}

// maxAncestry bounds the parents IsDescendant reads: a chain deeper than
// this is not called anyone's descendant (a harness that forks a deep
// chain is swept, never spared).
const maxAncestry = 256

// Lineage is what one walk up a process's parents, read from /proc (at
// most maxAncestry of them), found.
type Lineage struct {
	// Descends: the ancestor asked for is among the parents. A pidns sweep
	// spares the service's descendants with it: a harness's processes
	// never become the service's (an orphan goes to PID 1, shim).
	Descends bool
	// Outside: the process, or one of its parents, was entered into this
	// pid namespace from outside it (docker exec, kubectl exec, nsenter:
	// setns), /proc showing a parent of 0. A pidns sweep spares them, as a
	// fence with cgroups leaves alone what is outside the generation's
	// cgroup: nothing a generation runs can be such a process, because
	// everything in the namespace descends from its PID 1 (shim), an orphan
	// is given to PID 1 (or a subreaper below it), and no process can make
	// its parent one outside the namespace.
	Outside bool
}

// LineageOf walks pid's parents once, for ancestor (0: none asked) and for
// an entry from outside the namespace. A chain deeper than maxAncestry is
// neither (a harness that forks a deep chain is swept, never spared); so
// is a process whose /proc entry cannot be read.
func LineageOf(pid, ancestor int) Lineage {
	for i := 0; i < maxAncestry && pid > 1; i++ {
		_, ppid, err := procStat(pid)
		switch {
		case err != nil:
			return Lineage{}
		case ppid == 0:
			return Lineage{Outside: true}
		case ancestor > 0 && ppid == ancestor:
			return Lineage{Descends: true}
		}
		pid = ppid
	}
	return Lineage{}
}

// IsDescendant reports whether ancestor is among pid's parents (LineageOf).
func IsDescendant(pid, ancestor int) bool { return LineageOf(pid, ancestor).Descends }

// procComm returns the command name of pid for error messages.
func procComm(pid int) string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(data))
}

// signalIf sends sig to pid only if check(pid) still holds after the
// process has been pinned with a pidfd, so a pid that exited and was reused
// by an unrelated process is never signalled. A process that is already
// gone is not an error. Never signals PID 1 or the caller.
func signalIf(pid int, sig unix.Signal, check func(int) bool) error {
	if pid <= 1 || pid == os.Getpid() {
		return nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return nil
	case errors.Is(err, unix.ENOSYS):
		// Kernel < 5.3: no pidfd. The window between check and kill is
		// tiny and the processes are frozen or stopped where it matters.
		if !check(pid) {
			return nil
		}
		if err := unix.Kill(pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("signal %d: %w", pid, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !check(pid) {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("signal %d: %w", pid, err)
	}
	return nil
}

// waitUntil calls cond until it reports true, the context ends, or cond
// fails. Between calls it waits for an inotify event on watch (cgroup2
// control files such as cgroup.events notify on change) or for a short,
// growing interval, so a missed or rate-limited notification only costs
// latency. watch may be "" for pure polling.
func waitUntil(ctx context.Context, watch string, cond func() (bool, error)) error {
	// Most waits end within a few milliseconds: poll first and set up
	// inotify only for longer waits; close it off the caller's path
	// (closing an inotify fd waits for an SRCU grace period, ~10ms).
	const inotifyAfter = 2 * time.Millisecond
	const maxInterval = 20 * time.Millisecond
	ifd := -1
	defer func() {
		if ifd >= 0 {
			go unix.Close(ifd)
		}
	}()
	interval := 50 * time.Microsecond
	buf := make([]byte, 4096)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if watch != "" && ifd < 0 && interval >= inotifyAfter {
			ifd = inotifyOn(watch)
			continue // re-check: a change may predate the watch
		}
		d := interval
		if dl, has := ctx.Deadline(); has {
			if left := time.Until(dl); left < d {
				d = max(left, 10*time.Microsecond)
			}
		}
		if ifd >= 0 {
			ts := unix.NsecToTimespec(d.Nanoseconds())
			fds := []unix.PollFd{{Fd: int32(ifd), Events: unix.POLLIN}}
			if n, _ := unix.Ppoll(fds, &ts, nil); n > 0 {
				for {
					if _, err := unix.Read(ifd, buf); err != nil {
						break
					}
				}
			}
		} else {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		interval = min(interval*2, maxInterval)
	}
}

// inotifyOn returns a non-blocking inotify fd watching file for changes,
// or -1 (the caller then just polls).
func inotifyOn(file string) int {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return -1
	}
	if _, err := unix.InotifyAddWatch(fd, file, unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		return -1
	}
	return fd
}

// readKV reads a flat "key value" file such as cgroup.events.
func readKV(file, key string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s: no %q", file, key)
}

// alive reports whether a process with state letter st still runs: not a
// zombie, or a zombie thread-group leader whose other threads still run.
func alive(pid int, st byte) bool {
	if st != 'Z' && st != 'X' {
		return true
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n > 1
		}
	}
	return false
}
