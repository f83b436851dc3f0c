package cgroup

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestMain runs the helper modes of the test binary (re-executed as a
// child) before the tests.
func TestMain(m *testing.M) {
	switch os.Getenv("SHIM_CGROUP_HELPER") {
	case "adopt":
		os.Exit(helperAdopt())
	case "pidns":
		os.Exit(helperPidns())
	case "detect":
		os.Exit(helperDetect())
	case "selfmount-gate":
		os.Exit(helperSelfMountGate())
	case "selfmount":
		os.Exit(helperSelfMount())
	}
	os.Exit(m.Run())
}

// skipOrFatal skips an integration test whose environment is missing,
// unless SHIM_REQUIRE_INTEGRATION=1 demands it runs (CI on a known host).
func skipOrFatal(t testing.TB, format string, args ...any) {
	t.Helper()
	testutil.Need(t, false, fmt.Sprintf(format, args...))
}

// requireV2 returns the cgroup2 mount point, or skips when not root or no
// writable cgroup2 mount exists.
func requireV2(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFatal(t, "needs root")
	}
	h, err := probeHost()
	if err != nil {
		t.Fatal(err)
	}
	if h.v2 == nil {
		skipOrFatal(t, "no cgroup2 mount")
	}
	if err := unix.Access(h.v2.point, unix.W_OK); err != nil {
		skipOrFatal(t, "cgroup2 mount %s not writable: %v", h.v2.point, err)
	}
	return h.v2.point
}

// requireFreezer returns the v1 freezer mount point, or skips.
func requireFreezer(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		skipOrFatal(t, "needs root")
	}
	h, err := probeHost()
	if err != nil {
		t.Fatal(err)
	}
	if h.freezer == nil {
		skipOrFatal(t, "no cgroup v1 freezer mount")
	}
	if err := unix.Access(h.freezer.point, unix.W_OK); err != nil {
		skipOrFatal(t, "freezer mount %s not writable: %v", h.freezer.point, err)
	}
	return h.freezer.point
}

// testRoot returns a fresh, not yet created root path under mount and
// registers its removal (killing whatever the test left inside).
func testRoot(t testing.TB, mount string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	root := filepath.Join(mount, "shim-test-"+hex.EncodeToString(b))
	t.Cleanup(func() { destroyTree(t, root) })
	return root
}

// destroyTree kills every process in the test's own cgroup tree and removes
// it, deepest first. Only ever called on a root the test created.
func destroyTree(t testing.TB, dir string) {
	kids, err := subdirs(dir)
	if err != nil {
		return
	}
	for _, k := range kids {
		destroyTree(t, filepath.Join(dir, k))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = waitUntil(ctx, "", func() (bool, error) {
		pids, err := readPids(filepath.Join(dir, "cgroup.procs"))
		if err != nil || len(pids) == 0 {
			return true, nil
		}
		if writeFile(filepath.Join(dir, "cgroup.kill"), "1") != nil {
			_ = writeFile(filepath.Join(dir, "freezer.state"), "THAWED")
			for _, p := range pids {
				_ = signalIf(p, unix.SIGKILL, func(int) bool { return true })
			}
		}
		return false, nil
	})
	for i := 0; i < 100; i++ {
		if err := unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("cleanup: cannot remove %s", dir)
}

// startIn starts `sh -c script` inside g: with CloneFD where available,
// else held at a gate (a read from stdin) until Add placed it. The process
// is killed and reaped at cleanup if still there.
func startIn(t testing.TB, g Group, script string, setsid bool) *exec.Cmd {
	t.Helper()
	fd, ok, err := g.CloneFD()
	if err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	var gate io.WriteCloser
	if ok {
		defer unix.Close(fd)
		cmd = exec.Command("sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Setsid: setsid}
	} else {
		cmd = exec.Command("sh", "-c", "read _gate; "+script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
		if gate, err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if gate != nil {
		if err := g.Add(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		gate.Close()
	}
	return cmd
}

// waitProcs waits until g holds at least n processes.
func waitProcs(t testing.TB, g Group, n int) []int {
	t.Helper()
	var pids []int
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	err := waitUntil(ctx, "", func() (bool, error) {
		var err error
		pids, err = g.Procs()
		return len(pids) >= n, err
	})
	if err != nil {
		t.Fatalf("group %s: %d processes, want >= %d: %v", g.Name(), len(pids), n, err)
	}
	return pids
}

// cpuTicks returns utime+stime of pid.
func cpuTicks(t testing.TB, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	var u, s int64
	fmt.Sscan(f[11], &u)
	fmt.Sscan(f[12], &s)
	return u + s
}

func wantCode(t testing.TB, err error, code string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want code %s", code)
	}
	if got := CodeOf(err); got != code {
		t.Fatalf("got code %q (%v), want %s", got, err, code)
	}
	t.Logf("%s: %v", code, err)
}

// helperAdopt runs in a child: New on $SHIM_CGROUP_ROOT, AdoptSelf, report
// "ok", then wait for stdin to close.
func helperAdopt() int {
	m, err := New(Config{Root: os.Getenv("SHIM_CGROUP_ROOT")}, nil)
	if err == nil {
		err = m.AdoptSelf()
	}
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ok")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// helperDetect waits for a line on stdin (the parent places it meanwhile),
// then prints the mode and root New detects with the default config.
func helperDetect() int {
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	m, err := New(Config{}, nil)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println(m.Mode(), m.Root())
	return 0
}
