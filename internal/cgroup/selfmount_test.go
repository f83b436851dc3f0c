package cgroup

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCapEffHas(t *testing.T) {
	status := []byte("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t00000000a80425fb\n")
	// a80425fb: Docker's default set: CHOWN..SETFCAP, NET_BIND_SERVICE, NET_RAW, SYS_CHROOT, MKNOD, AUDIT_WRITE.
	for c, want := range map[int]bool{unix.CAP_CHOWN: true, unix.CAP_NET_RAW: true, unix.CAP_SYS_ADMIN: false, unix.CAP_NET_ADMIN: false} {
		if got := capEffHas(status, c); got != want {
			t.Errorf("cap %d: got %v want %v", c, got, want)
		}
	}
	if !capEffHas([]byte("CapEff:\t000001ffffffffff\n"), unix.CAP_SYS_ADMIN) {
		t.Error("full set lacks SYS_ADMIN")
	}
	if capEffHas([]byte("CapPrm:\tffffffffff\n"), unix.CAP_SYS_ADMIN) {
		t.Error("no CapEff line must read as no capability")
	}
}

func TestMountOptsParsed(t *testing.T) {
	in := "1045 1040 0:38 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw,nsdelegate\n" +
		"1046 1040 0:38 / /x rw,relatime - cgroup2 cgroup2 rw\n"
	ms := parseMountinfo([]byte(in))
	if len(ms) != 2 || !ms[0].readOnly() || ms[1].readOnly() {
		t.Fatalf("readOnly: %+v", ms)
	}
	if f := mountFlags(ms[0].mountOpts); f != unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RELATIME {
		t.Errorf("mountFlags = %#x", f)
	}
}

// TestMayMountAndHints: shim touches mounts only as a container's PID 1 in
// a private cgroup namespace with CAP_SYS_ADMIN, and otherwise names the
// docker run flags that are missing.
func TestMayMountAndHints(t *testing.T) {
	container := host{pidnsInit: true, self: procCgroups{unified: "/"}, sysAdmin: true, netAdmin: true}
	cases := []struct {
		name    string
		edit    func(h *host)
		may     bool
		flags   string
		netNote string
	}{
		{"full", func(h *host) {}, true, "", ""},
		{"no caps", func(h *host) { h.sysAdmin, h.netAdmin = false, false }, false, "--cap-add SYS_ADMIN", "--cap-add SYS_ADMIN --cap-add NET_ADMIN"},
		{"host cgroupns", func(h *host) { h.initialNS = true; h.self.unified = "/docker/abc" }, false, "--cgroupns=private", ""},
		{"host cgroupns at top", func(h *host) { h.initialNS = true }, false, "--cgroupns=private", ""},
		{"nothing", func(h *host) { h.initialNS, h.sysAdmin, h.netAdmin = true, false, false }, false,
			"--cap-add SYS_ADMIN --cgroupns=private", "--cap-add SYS_ADMIN --cap-add NET_ADMIN"},
		{"no net admin", func(h *host) { h.netAdmin = false }, true, "", "--cap-add NET_ADMIN"},
		{"moved out of ns root", func(h *host) { h.self.unified = "/shim" }, false, "", ""},
		{"apparmor", func(h *host) { h.prepareErr = fmt.Errorf("mount cgroup2 at x: %w", unix.EPERM) }, true, "--security-opt apparmor=unconfined", ""},
		{"host", func(h *host) { h.pidnsInit, h.initialNS, h.sysAdmin = false, true, false }, false, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := container
			c.edit(&h)
			if err := h.mayMount(); (err == nil) != c.may {
				t.Errorf("mayMount = %v, want allowed=%v", err, c.may)
			}
			if got := strings.Join(h.cgroup2Flags(), " "); got != c.flags {
				t.Errorf("flags %q, want %q", got, c.flags)
			}
			if c.flags != "" && h.hint() != "; run with "+c.flags+" for cgroup2" {
				t.Errorf("hint %q", h.hint())
			}
			if n := h.netNote(); (c.netNote == "") != (n == "") || !strings.HasSuffix(n, c.netNote) {
				t.Errorf("netNote %q, want ...%q", n, c.netNote)
			}
		})
	}
}

// selfMountReport is what the selfmount helper prints as JSON.
type selfMountReport struct {
	Mode       Mode
	Root       string
	Reason     string
	Mounts     []string // cgroup2 mounts after New: "point root opts"
	GroupOK    bool     // created, entered and removed gen-1
	Error      string
	InitialNS  bool
	SysAdmin   bool
	UnifiedCg  string
	PidnsInit  bool
	ProcCgroup string
}

// runSelfMount runs the helper as PID 1 of new pid and mount namespaces
// (and a new cgroup namespace when cgroupns), placed in a fresh cgroup2
// cgroup of the test, with scenario "mount" (no cgroup2 mounted) or
// "remount" (a read-only one).
func runSelfMount(t *testing.T, scenario string, cgroupns bool) selfMountReport {
	t.Helper()
	mount := requireV2(t)
	top := testRoot(t, mount)
	root := filepath.Join(top, "ns")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// The gate runs in root and clones the helper from there, so the
	// helper's cgroup namespace is rooted at root; then the gate moves
	// itself up to top, leaving the helper alone in root, as shim is in a
	// container's cgroup.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHIM_CGROUP_HELPER=selfmount-gate", "SHIM_SELFMOUNT_TOP="+top,
		"SHIM_SELFMOUNT_SCENARIO="+scenario, "SHIM_SELFMOUNT_CGROUPNS="+strconv.FormatBool(cgroupns),
		"SHIM_SELFMOUNT_DIR="+filepath.Join(t.TempDir(), "cgroup2"))
	stdin, _ := cmd.StdinPipe()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := writeFile(filepath.Join(root, "cgroup.procs"), strconv.Itoa(cmd.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	stdin.Write([]byte("go\n"))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v: %s", err, out.String())
	}
	var r selfMountReport
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		t.Fatalf("helper output %q: %v", out.String(), err)
	}
	t.Logf("%+v", r)
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	return r
}

// Docker on a cgroup v1/hybrid host with --cap-add SYS_ADMIN
// --cgroupns=private: no cgroup2 in the container; shim mounts it.
func TestSelfMountCgroup2(t *testing.T) {
	r := runSelfMount(t, "mount", true)
	if r.Mode != ModeCgroup2 || !r.GroupOK || !strings.Contains(r.Reason, "shim mounted cgroup2 at ") {
		t.Fatalf("want cgroup2 on a self-made mount: %+v", r)
	}
	if len(r.Mounts) != 1 || !strings.HasPrefix(r.Mounts[0], r.Root+" / ") {
		t.Fatalf("want exactly one cgroup2 mount, at the root, showing /: %q", r.Mounts)
	}
}

// Docker on a cgroup v2 host with --cap-add SYS_ADMIN (private cgroup
// namespace is its default): /sys/fs/cgroup is cgroup2, read-only.
func TestSelfRemountCgroup2ReadWrite(t *testing.T) {
	r := runSelfMount(t, "remount", true)
	if r.Mode != ModeCgroup2 || !r.GroupOK || !strings.Contains(r.Reason, "remounted the read-only cgroup2 mount") {
		t.Fatalf("want cgroup2 after a remount: %+v", r)
	}
	if len(r.Mounts) != 1 || !strings.Contains(r.Mounts[0], " rw,") {
		t.Fatalf("mount not read-write: %q", r.Mounts)
	}
}

// In the host's cgroup namespace shim must neither mount nor remount, and
// must say that --cgroupns=private is missing.
func TestSelfMountRefusedInHostCgroupNS(t *testing.T) {
	for _, sc := range []string{"mount", "remount"} {
		t.Run(sc, func(t *testing.T) {
			r := runSelfMount(t, sc, false)
			if r.Mode == ModeCgroup2 || !strings.Contains(r.Reason, "--cgroupns=private") ||
				strings.Contains(r.Reason, "--cap-add SYS_ADMIN") {
				t.Fatalf("want a fallback naming --cgroupns=private: %+v", r)
			}
			want := 0
			if sc == "remount" {
				want = 1
			}
			if len(r.Mounts) != want || (want == 1 && !strings.Contains(r.Mounts[0], " ro,")) {
				t.Fatalf("shim changed the mounts: %q", r.Mounts)
			}
		})
	}
}

// helperSelfMountGate waits until the test placed it in its cgroup, then
// runs the selfmount helper as PID 1 of new namespaces and relays its output.
func helperSelfMountGate() int {
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	flags := uintptr(unix.CLONE_NEWPID | unix.CLONE_NEWNS)
	if os.Getenv("SHIM_SELFMOUNT_CGROUPNS") == "true" {
		flags |= unix.CLONE_NEWCGROUP
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SHIM_CGROUP_HELPER=selfmount")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	gate, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err == nil {
		err = writeFile(filepath.Join(os.Getenv("SHIM_SELFMOUNT_TOP"), "cgroup.procs"), strconv.Itoa(os.Getpid()))
		gate.Close()
		if werr := cmd.Wait(); err == nil {
			err = werr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "selfmount helper:", err)
		return 1
	}
	return 0
}

// helperSelfMount is PID 1 of new pid, mount (and cgroup) namespaces. In
// its private mount namespace it removes every cgroup2 mount (a container
// on a cgroup v1 host) or replaces them by one read-only mount (a
// container on a cgroup v2 host), then runs New with the default root.
func helperSelfMount() int {
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // the gate left the cgroup
	var r selfMountReport
	defer func() { _ = json.NewEncoder(os.Stdout).Encode(r) }()
	fail := func(err error) int { r.Error = err.Error(); return 0 }
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fail(fmt.Errorf("make mounts private: %w", err))
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fail(fmt.Errorf("mount proc: %w", err))
	}
	v2Mounts := func() []mountInfo {
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		var out []mountInfo
		for _, m := range parseMountinfo(mi) {
			if m.fstype == "cgroup2" {
				out = append(out, m)
			}
		}
		return out
	}
	for i := 0; i < 10; i++ {
		ms := v2Mounts()
		if len(ms) == 0 {
			break
		}
		for _, m := range ms {
			_ = unix.Unmount(m.point, unix.MNT_DETACH)
		}
	}
	if len(v2Mounts()) != 0 {
		return fail(errors.New("cannot unmount cgroup2"))
	}
	dir := os.Getenv("SHIM_SELFMOUNT_DIR")
	if os.Getenv("SHIM_SELFMOUNT_SCENARIO") == "remount" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fail(err)
		}
		if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fail(fmt.Errorf("mount cgroup2: %w", err))
		}
		// What runc does for an unprivileged container: a read-only bind.
		if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fail(fmt.Errorf("remount cgroup2 ro: %w", err))
		}
	}
	h, err := probeHost()
	if err != nil {
		return fail(err)
	}
	r.InitialNS, r.SysAdmin, r.UnifiedCg, r.PidnsInit = h.initialNS, h.sysAdmin, h.self.unified, h.pidnsInit
	pc, _ := os.ReadFile("/proc/self/cgroup")
	r.ProcCgroup = string(pc)
	m, err := New(Config{MountDir: dir}, nil)
	for _, mi := range v2Mounts() {
		r.Mounts = append(r.Mounts, mi.point+" "+mi.root+" "+strings.Join(mi.mountOpts, ","))
	}
	if err != nil {
		r.Reason = "error: " + err.Error()
		return 0
	}
	r.Mode, r.Root, r.Reason = m.Mode(), m.Root(), m.Reason()
	if m.Mode() != ModeCgroup2 {
		return 0
	}
	if err := m.AdoptSelf(); err != nil {
		return fail(fmt.Errorf("AdoptSelf: %w", err))
	}
	g, err := m.Create("gen-1", Limits{})
	if err != nil {
		return fail(err)
	}
	c := exec.Command("true")
	c.SysProcAttr = &syscall.SysProcAttr{}
	if fd, ok, err := g.CloneFD(); err == nil && ok {
		c.SysProcAttr.UseCgroupFD, c.SysProcAttr.CgroupFD = true, fd
		defer unix.Close(fd)
	}
	if err := c.Run(); err != nil {
		return fail(fmt.Errorf("run in gen-1: %w", err))
	}
	if err := g.Remove(); err != nil {
		return fail(err)
	}
	r.GroupOK = true
	return 0
}
