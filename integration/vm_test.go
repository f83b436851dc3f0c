package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
	"github.com/shimdev/shim/internal/testutil"
)

// TestVMShimAsTheKernelsInit boots a tiny guest (images/vm/build.sh:
// Debian's cloud kernel, an initramfs with shim as /init) under QEMU's
// microvm machine, KVM where it works and TCG otherwise, and drives shim
// from the host over a virtio-serial port (and vsock where this machine
// has /dev/vhost-vsock; a harness's vsock dial from inside the guest is
// refused either way): generation 1 edits the guest's checkout and
// leaves a setsid daemon behind, generation 2 fences it (0 survivors, the
// edits saved), then Ctrl-Alt-Del (what Firecracker's SendCtrlAltDel
// sends) shuts shim down and it powers the machine off: QEMU exits on its
// own. Every wait is on the console's output or the channel's answer.
func TestVMShimAsTheKernelsInit(t *testing.T) {
	testutil.NeedRoot(t)
	qemu := testutil.NeedTool(t, "qemu-system-x86_64")
	for _, tool := range []string{"busybox", "cpio", "dpkg-deb", "git"} {
		testutil.NeedTool(t, tool)
	}
	accel, why := vmAccel()
	vsock := fileExists("/dev/vhost-vsock")
	t.Logf("accelerator %s (%s)", accel, why)
	if !vsock {
		t.Logf("no /dev/vhost-vsock on this machine: the host drives shim over virtio-serial only; vsock is exercised from inside the guest (loopback, refused), not from the host")
	}
	bound := 5 * time.Minute // TCG: a slow boot and slow git, but never this slow
	if accel == "kvm" {
		bound = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()

	dir, err := os.MkdirTemp("", "shim-vm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	cid := uint32(1000 + rand.IntN(1<<20))
	// vsock is served even without a host-side device: the guest's
	// loopback transport lets its own processes dial it, and shim must
	// refuse them.
	conf := "listen=serial:shim.ctl\nlisten=vsock:1024\n"
	if err := os.WriteFile(filepath.Join(dir, "init.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.CommandContext(ctx, "../images/vm/build.sh", "--shim", shimBin, "--out", filepath.Join(dir, "guest"),
		"--conf", filepath.Join(dir, "init.conf"))
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("images/vm/build.sh: %v\n%s", err, out)
	}

	ctl := filepath.Join(dir, "ctl.sock")
	qmp := filepath.Join(dir, "qmp.sock")
	appendLine := "console=ttyS0 panic=-1 quiet"
	args := []string{"-M", "microvm", "-m", "512", "-smp", "1", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-serial", "stdio", "-device", "i8042",
		"-kernel", filepath.Join(dir, "guest", "vmlinuz"), "-initrd", filepath.Join(dir, "guest", "initrd"),
		"-device", "virtio-serial-device",
		"-chardev", "socket,id=ctl,path=" + ctl + ",server=on,wait=off",
		"-device", "virtserialport,chardev=ctl,name=shim.ctl",
		"-qmp", "unix:" + qmp + ",server=on,wait=off"}
	if accel == "kvm" {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		// microvm has no HPET and no PIT-calibrated TSC under TCG: without a
		// TSC frequency the kernel's clock does not advance.
		args = append(args, "-accel", "tcg", "-cpu", "max")
		appendLine += " tsc_early_khz=2000000 tsc=reliable"
	}
	if vsock {
		args = append(args, "-device", fmt.Sprintf("vhost-vsock-device,guest-cid=%d", cid))
	}
	args = append(args, "-append", appendLine)
	vm := startVM(t, qemu, args)

	booted := vm.waitFor(t, ctx, `\[VM\] shim: booted as the kernel's init uptime_ms=(\d+)`)
	ready := vm.waitFor(t, ctx, `\[VM\] shim: ready uptime_ms=(\d+)`)
	kernelMS, _ := strconv.Atoi(booted[1])
	bootMS, _ := strconv.Atoi(ready[1])
	vm.waitFor(t, ctx, `control channel listening: listen=serial:shim.ctl`)

	c, err := client.Connect("serial:" + ctl)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		vm.dump(t)
		t.Fatalf("status over virtio-serial: %v", err)
	}
	if _, err := c.Status(ctx); err != nil { // a second call on the kept-alive connection
		t.Fatalf("status again over virtio-serial: %v", err)
	}
	if st.ShimPid != 1 || st.Subreaper || st.Mode != "cgroup2" {
		t.Fatalf("shim in the guest: pid %d, subreaper %v, mode %s; want PID 1 on cgroup2", st.ShimPid, st.Subreaper, st.Mode)
	}
	t.Logf("guest: shim PID 1, mode %s, isolation %s %s, cgroup root %s", st.Mode, st.Isolation.Mode, st.Isolation.Reason, st.CgroupRoot)

	vm.waitFor(t, ctx, `control channel listening: listen=vsock:1024`)
	if vsock {
		vc, err := client.Connect(fmt.Sprintf("vsock:%d:1024", cid))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := vc.Status(ctx); err != nil {
			t.Fatalf("status over vsock from the host: %v", err)
		}
	}

	// Generation 1: edits in the checkout and a setsid daemon, then it
	// says so on the console (the kernel's log at a level quiet shows) and
	// keeps running.
	gen1 := api.StartRequest{Generation: 1, Worktree: "/workspace", Cwd: "/workspace", Command: []string{"/bin/sh", "-c",
		`echo abandoned >> README || exit 1; echo new > new.txt || exit 1
		setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &
		echo "<2>shim-test: generation 1 edited, daemon $!" > /dev/kmsg; exec sleep 100000`}}
	if _, err := c.Start(ctx, gen1); err != nil {
		vm.dump(t)
		t.Fatalf("announce generation 1: %v", err)
	}
	vm.waitFor(t, ctx, `shim-test: generation 1 edited, daemon \d+`)

	// Generation 2 fences it. Its harness (root in the guest) then tries
	// every way to shim: the serial port (shim holds it: the open is
	// refused), vsock through the guest's loopback (CID 1: refused) and
	// the unix socket (from a harness cgroup: refused).
	gen2 := api.StartRequest{Generation: 2, Worktree: "/workspace", Command: []string{"/bin/sh", "-c",
		`for p in /sys/class/virtio-ports/*; do n=$(cat $p/name); d=/dev/${p##*/}
		if echo '{}' > $d 2>/dev/null; then r=opened; else r=refused; fi
		echo "<2>shim-test: harness port $n $r" > /dev/kmsg; done
		v=$(shim ctl --connect vsock:1:1024 status 2>&1 | grep -o '"code":"[A-Z_]*"')
		echo "<2>shim-test: harness vsock $v" > /dev/kmsg
		u=$(shim ctl status 2>&1 | grep -o '"code":"[A-Z_]*"')
		echo "<2>shim-test: harness unix $u" > /dev/kmsg
		exec sleep 100000`}}
	res, err := c.Start(ctx, gen2)
	if err != nil {
		vm.dump(t)
		t.Fatalf("announce generation 2: %v", err)
	}
	if len(res.Fenced) != 1 {
		t.Fatalf("generation 2 fenced %d generations, want 1: %+v", len(res.Fenced), res.Fenced)
	}
	r := res.Fenced[0]
	b, _ := json.Marshal(r)
	t.Logf("fence report in the guest: %s", b)
	if r.Generation != 1 || r.Survivors != 0 || r.Killed < 2 {
		t.Fatalf("fence of generation 1: generation %d, killed %d, survivors %d; want 1, at least the harness and the daemon, 0", r.Generation, r.Killed, r.Survivors)
	}
	if r.SnapshotRef != "refs/shim/abandoned/1" || r.Worktree == nil || r.Worktree.Modified != 1 || r.Worktree.Added != 1 {
		t.Fatalf("generation 1's edits: ref %q, worktree %+v; want refs/shim/abandoned/1 with README modified and new.txt added", r.SnapshotRef, r.Worktree)
	}
	if r.Worktree.Isolation != "layers" {
		vm.dump(t)
		t.Fatalf("generation 1 ran with isolation %q, want layers (overlayfs in the guest)", r.Worktree.Isolation)
	}
	if m := vm.waitFor(t, ctx, `shim-test: harness port shim.ctl (\w+)`); m[1] != "refused" {
		t.Fatalf("generation 2's harness %s the control channel's port", m[1])
	}
	for _, ch := range []string{"vsock", "unix"} {
		if m := vm.waitFor(t, ctx, `shim-test: harness `+ch+` (.*)`); m[1] != `"code":"PEER_NOT_ALLOWED"` {
			t.Fatalf("generation 2's harness over %s: %q, want PEER_NOT_ALLOWED", ch, m[1])
		}
	}
	snap, err := c.Snapshot(ctx, "/workspace", 1)
	if err != nil || snap.Commit != r.SnapshotCommit {
		t.Fatalf("snapshot of generation 1: %+v, %v", snap, err)
	}

	// Ctrl-Alt-Del: shim shuts down, syncs and powers the machine off.
	if err := qmpSendCtrlAltDel(ctx, qmp); err != nil {
		t.Fatalf("ctrl-alt-del through QMP: %v", err)
	}
	vm.waitFor(t, ctx, `shim: shutting down signal=interrupt`)
	vm.waitFor(t, ctx, `shim init ended; syncing and powering off`)
	select {
	case <-vm.exited:
	case <-ctx.Done():
		vm.dump(t)
		t.Fatal("QEMU still runs: the guest did not power off")
	}
	if vm.err != nil {
		t.Fatalf("QEMU exited with %v", vm.err)
	}
	vm.waitFor(t, ctx, `reboot: Power down`)
	t.Logf("%s: boot to ready %d ms (kernel uptime at shim ready; shim started at %d ms); fence of generation 1 in the guest: total %.0f ms (freeze %.0f, cut %.0f, kill %.0f, restore %.0f), start of generation 2 %.0f ms",
		accel, bootMS, kernelMS, r.DurationsMS["total"], r.DurationsMS["freeze"], r.DurationsMS["cut"], r.DurationsMS["kill"], r.DurationsMS["restore"], res.DurationsMS["start"])
}

// vmAccel is KVM when /dev/kvm opens and the CPU shows hardware
// virtualisation (vmx or svm: a nested hypervisor without them may give a
// /dev/kvm that boots no ordinary kernel), else TCG. SHIM_VM_ACCEL=kvm or
// tcg decides instead.
func vmAccel() (string, string) {
	if a := os.Getenv("SHIM_VM_ACCEL"); a == "kvm" || a == "tcg" {
		return a, "SHIM_VM_ACCEL"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", fmt.Sprintf("no usable /dev/kvm: %v", err)
	}
	f.Close()
	cpu, _ := os.ReadFile("/proc/cpuinfo")
	if !regexp.MustCompile(`(?m)^flags\s*:.*\b(vmx|svm)\b`).Match(cpu) {
		return "tcg", "/dev/kvm opens but the CPU shows no vmx or svm flag"
	}
	return "kvm", "/dev/kvm and hardware virtualisation"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// guest is a QEMU process and its console.
type guest struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced at every new line
	exited  chan struct{}
	err     error // QEMU's exit, once exited is closed
}

func startVM(t *testing.T, qemu string, args []string) *guest {
	t.Helper()
	cmd := exec.Command(qemu, args...)
	cmd.Stdin = nil
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g := &guest{changed: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			g.mu.Lock()
			g.lines = append(g.lines, strings.TrimRight(sc.Text(), "\r"))
			close(g.changed)
			g.changed = make(chan struct{})
			g.mu.Unlock()
		}
		io.Copy(io.Discard, out)
		g.err = cmd.Wait()
		close(g.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-g.exited:
		default:
			cmd.Process.Kill() // our own QEMU, by its pid
			<-g.exited
		}
	})
	return g
}

// waitFor waits until a console line matches re and returns its
// submatches; the test fails at ctx's end.
func (g *guest) waitFor(t *testing.T, ctx context.Context, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	for i := 0; ; {
		g.mu.Lock()
		for ; i < len(g.lines); i++ {
			if m := rx.FindStringSubmatch(g.lines[i]); m != nil {
				g.mu.Unlock()
				return m
			}
		}
		changed := g.changed
		g.mu.Unlock()
		select {
		case <-changed:
		case <-g.exited:
			// The last lines are in: one more look, then give up.
			g.mu.Lock()
			n := len(g.lines)
			g.mu.Unlock()
			if i == n {
				g.dump(t)
				t.Fatalf("QEMU exited (%v) before the console said %q", g.err, re)
			}
		case <-ctx.Done():
			g.dump(t)
			t.Fatalf("the console did not say %q in time", re)
		}
	}
}

func (g *guest) dump(t *testing.T) {
	g.mu.Lock()
	defer g.mu.Unlock()
	from := max(0, len(g.lines)-80)
	t.Logf("guest console (last %d lines):\n%s", len(g.lines)-from, strings.Join(g.lines[from:], "\n"))
}

// qmpSendCtrlAltDel presses Ctrl-Alt-Del on the guest's i8042 keyboard
// through QEMU's QMP socket.
func qmpSendCtrlAltDel(ctx context.Context, path string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	dec := json.NewDecoder(c)
	var greeting map[string]any
	if err := dec.Decode(&greeting); err != nil {
		return fmt.Errorf("greeting: %w", err)
	}
	call := func(cmd string, args any) error {
		req := map[string]any{"execute": cmd}
		if args != nil {
			req["arguments"] = args
		}
		if err := json.NewEncoder(c).Encode(req); err != nil {
			return err
		}
		for {
			var resp map[string]any
			if err := dec.Decode(&resp); err != nil {
				return err
			}
			if e, ok := resp["error"]; ok {
				return fmt.Errorf("%s: %v", cmd, e)
			}
			if _, ok := resp["return"]; ok {
				return nil
			}
			// an event: read on
		}
	}
	if err := call("qmp_capabilities", nil); err != nil {
		return err
	}
	key := func(k string) map[string]string { return map[string]string{"type": "qcode", "data": k} }
	return call("send-key", map[string]any{"keys": []any{key("ctrl"), key("alt"), key("delete")}})
}
