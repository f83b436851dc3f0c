package network

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The tests only ever touch cgroups they created (shim-nettest-<pid>-<n>
// directly under the cgroup2 mount) and processes they started in them.

var cgroupSeq atomic.Int64

// cgroup2Mount returns the mount point of the cgroup2 hierarchy:
// /sys/fs/cgroup on a pure cgroup2 host, /sys/fs/cgroup/unified on a
// hybrid one.
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		if fs := strings.Fields(post); len(fs) > 0 && fs[0] == "cgroup2" {
			if f := strings.Fields(pre); len(f) >= 5 {
				return f[4], nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("no cgroup2 mount in /proc/self/mountinfo")
}

// testCgroup is a cgroup the test created, and the processes it started in
// it.
type testCgroup struct {
	path string
	id   uint64

	mu   sync.Mutex
	cmds []*exec.Cmd
}

// newTestCgroup creates a fresh cgroup and removes it (killing what the
// test started in it) when the test ends.
func newTestCgroup(t testing.TB) *testCgroup {
	t.Helper()
	requireNetns(t)
	root, err := cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	g := &testCgroup{path: filepath.Join(root, fmt.Sprintf("shim-nettest-%d-%d", os.Getpid(), cgroupSeq.Add(1)))}
	if err := os.Mkdir(g.path, 0o755); err != nil {
		t.Fatalf("create test cgroup: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(g.path, &st); err != nil {
		t.Fatal(err)
	}
	g.id = st.Ino // a cgroup2 directory's inode number is the cgroup id
	t.Cleanup(func() { g.remove(t) })
	return g
}

// start starts the test binary in personality mode inside the cgroup
// (CLONE_INTO_CGROUP, so even its first instruction runs there) and
// returns it with a reader on its stdout. wrap, when set, is called with a
// function that does the fork, e.g. Network.Run to fork inside a
// generation's namespace.
func (g *testCgroup) start(t testing.TB, mode string, env []string, wrap func(func() error) error) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	dir, err := os.Open(g.path)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append([]string{envTestMode + "=" + mode}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd()), Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	if _, err := cmd.StdinPipe(); err != nil { // closed when the test ends; "sender" and "loop" wait for it
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if wrap == nil {
		wrap = func(f func() error) error { return f() }
	}
	if err := wrap(cmd.Start); err != nil {
		t.Fatalf("start %s: %v", mode, err)
	}
	g.mu.Lock()
	g.cmds = append(g.cmds, cmd)
	g.mu.Unlock()
	return cmd, bufio.NewReader(out)
}

// readLine reads one line of a child's stdout with a deadline.
func readLine(t testing.TB, r *bufio.Reader) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() { s, err := r.ReadString('\n'); ch <- res{strings.TrimSpace(s), err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("child output: %q %v", r.s, r.err)
		}
		return r.s
	case <-time.After(15 * time.Second):
		t.Fatal("child printed nothing within 15s")
	}
	return ""
}

// events returns the value of key in cgroup.events.
func (g *testCgroup) events(key string) string {
	b, _ := os.ReadFile(filepath.Join(g.path, "cgroup.events"))
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == key {
			return v
		}
	}
	return ""
}

// freeze freezes the cgroup and waits until the kernel says it is frozen,
// as the fence's first step does.
func (g *testCgroup) freeze(t testing.TB) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.path, "cgroup.freeze"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "frozen 1", func() bool { return g.events("frozen") == "1" })
}

// kill kills everything in the cgroup and waits until it is empty and the
// processes are reaped, as the fence's kill step does.
func (g *testCgroup) kill(t testing.TB) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.path, "cgroup.kill"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "populated 0", func() bool { return g.events("populated") == "0" })
	g.mu.Lock()
	cmds := g.cmds
	g.cmds = nil
	g.mu.Unlock()
	for _, c := range cmds {
		_ = c.Wait()
	}
}

func (g *testCgroup) remove(t testing.TB) {
	if _, err := os.Stat(g.path); err != nil {
		return
	}
	g.kill(t)
	if err := os.Remove(g.path); err != nil {
		t.Errorf("remove test cgroup: %v", err)
	}
}
