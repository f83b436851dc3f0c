package main

// shim as the init of a virtual machine's kernel (docs/microvm.md).
//
// When is shim a kernel's init rather than a container's? It is PID 1 of
// the initial pid namespace: /proc/self/ns/pid is the kernel's own
// (PROC_PID_INIT_INO). A container's PID 1 is never in it, whatever the
// runtime mounted for it, so the rule cannot mistake a container for a VM
// and never mounts anything in a container. (Whether the root holds a
// /proc, or the kernel command line says init=, tells nothing a container
// cannot imitate.) /proc may not be mounted yet: shim then mounts it to
// look, which only the kernel's init or a misbuilt container can need.
//
// As the kernel's init, shim does first what an init must (mounts, the
// console, modules, loopback, the hostname), reads its flags from
// /etc/shim/init.conf and the kernel command line, runs `shim init` as
// always, and when that ends, syncs and powers the machine off: PID 1 of
// a kernel never exits (the kernel panics).

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// initPidNS is PROC_PID_INIT_INO: the inode of the kernel's initial pid
// namespace, the same on every Linux since 3.8.
const initPidNS = "pid:[4026531836]"

// vmConfigFile holds shim's flags in a VM image, one NAME=VALUE a line.
var vmConfigFile = "/etc/shim/init.conf"

// vmReady is closed once shim init serves its control channels: the
// signals that power the machine off are forwarded to shim only from then
// on (before, shim has not asked for SIGTERM, and the Go runtime would
// exit on it: a kernel panic).
var vmReady = make(chan struct{})

// markReady is init.go's call once shim is ready; in a VM it reports the
// kernel's uptime then, boot-to-ready.
var markReady = func() {}

// isKernelInit reports whether shim is PID 1 of the kernel's initial pid
// namespace, mounting /proc to find out when nothing is mounted there.
func isKernelInit() bool {
	if os.Getpid() != 1 {
		return false
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		if _, serr := os.Stat("/proc/self"); serr == nil {
			return false // a /proc that cannot say: not the kernel's
		}
		if mountOnce("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "", 0o555) != nil {
			return false
		}
		if ns, err = os.Readlink("/proc/self/ns/pid"); err != nil {
			return false
		}
	}
	return ns == initPidNS
}

// vmOpts are what only a VM's init does, beside shim init's own flags.
type vmOpts struct {
	modules  []string // kernel modules to load, with their dependencies
	hostname string
	halt     string   // poweroff (default), reboot (Firecracker ends the VM on it) or halt
	flags    []string // shim init's flags, as --NAME=VALUE
}

// vmOnly are the names in init.conf and shim.NAME= that are not shim
// init's flags.
var vmOnly = map[string]bool{"modules": true, "hostname": true, "halt": true}

// runVMInit is shim as the kernel's init: set the machine up, run shim
// init with the flags of init.conf, the kernel command line and args (in
// that order: the last of a flag wins, repeatable ones add up), then power
// off. It never returns.
func runVMInit(args []string) int {
	vmLog("booted as the kernel's init", "uptime_ms", uptimeMS())
	args = initArgs(args)
	if err := mountEssentials(); err != nil {
		vmLog("cannot mount what an init must; powering off", "error", err)
		powerOff("poweroff")
	}
	consoleOnStdio()
	o, err := readVMConfig(vmConfigFile, "/proc/cmdline")
	if err != nil {
		vmLog("bad configuration; powering off", "error", err)
		powerOff(o.halt)
	}
	setUpMachine(o)
	markReady = func() {
		vmLog("ready", "uptime_ms", uptimeMS())
		close(vmReady)
	}
	go powerSignals()
	code := runInit(append(o.flags, args...))
	vmLog("shim init ended; syncing and powering off", "exit_code", code, "how", o.halt, "uptime_ms", uptimeMS())
	powerOff(o.halt)
	return code
}

// initArgs are shim init's flags among the arguments the kernel gave its
// init: those after "init" (init=/sbin/init ... -- init --flag). The
// kernel also hands init every word of its command line it does not know
// (a typo, a bare word meant for another init); taken as flags, the first
// would become a service command, so without "init" they are dropped.
func initArgs(args []string) []string {
	if len(args) > 0 && args[0] == "init" {
		return args[1:]
	}
	if len(args) > 0 {
		vmLog("ignoring the kernel's arguments to init (shim's flags follow \"init\")", "args", strings.Join(args, " "))
	}
	return nil
}

// setUpMachine does the rest of an init's job; what fails is logged and
// shim goes on (a missing module shows as a missing channel or isolation,
// which shim init reports itself).
func setUpMachine(o vmOpts) {
	if err := loadModules(o.modules, kernelParams("/proc/cmdline")); err != nil {
		vmLog("loading modules", "error", err)
	}
	if o.hostname != "" {
		if err := unix.Sethostname([]byte(o.hostname)); err != nil {
			vmLog("hostname", "error", err)
		}
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		err = netlink.LinkSetUp(lo)
		if err != nil {
			vmLog("loopback up", "error", err)
		}
	}
	enableControllers("/sys/fs/cgroup")
	// Ctrl-Alt-Del (QEMU's sendkey, Firecracker's SendCtrlAltDel) is then
	// SIGINT to PID 1 instead of an immediate reboot: shim shuts down.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF); err != nil {
		vmLog("ctrl-alt-del as SIGINT", "error", err)
	}
}

// powerSignals turns the signals that mean "shut the machine down"
// (Ctrl-Alt-Del's SIGINT, SIGPWR) into the SIGTERM shim init shuts down
// on, once it listens for it.
func powerSignals() {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, unix.SIGINT, unix.SIGPWR)
	for s := range ch {
		<-vmReady
		vmLog("shutting down", "signal", s.String())
		unix.Kill(os.Getpid(), unix.SIGTERM)
	}
}

// mountEssentials mounts what a kernel's init must, each only where
// nothing is mounted yet.
func mountEssentials() error {
	const nosuid, nodev, noexec = unix.MS_NOSUID, unix.MS_NODEV, unix.MS_NOEXEC
	for _, m := range []struct {
		src, dir, fstype string
		flags            uintptr
		data             string
		mode             os.FileMode
		required         bool
	}{
		{"proc", "/proc", "proc", nosuid | nodev | noexec, "", 0o555, true},
		{"sysfs", "/sys", "sysfs", nosuid | nodev | noexec, "", 0o555, true},
		{"devtmpfs", "/dev", "devtmpfs", nosuid, "mode=0755", 0o755, true},
		{"devpts", "/dev/pts", "devpts", nosuid | noexec, "newinstance,ptmxmode=0666,mode=0620,gid=5", 0o755, false},
		{"tmpfs", "/dev/shm", "tmpfs", nosuid | nodev, "mode=1777", 0o1777, false},
		{"tmpfs", "/run", "tmpfs", nosuid | nodev, "mode=0755", 0o755, true},
		{"tmpfs", "/tmp", "tmpfs", nosuid | nodev, "mode=1777", 0o1777, false},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", nosuid | nodev | noexec, "nsdelegate", 0o555, true},
	} {
		if err := mountOnce(m.src, m.dir, m.fstype, m.flags, m.data, m.mode); err != nil && m.required {
			return err
		}
	}
	for link, target := range map[string]string{"/dev/ptmx": "pts/ptmx", "/dev/fd": "/proc/self/fd",
		"/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2"} {
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			os.Symlink(target, link)
		}
	}
	return nil
}

// mountOnce mounts fstype at dir unless something is mounted there.
func mountOnce(src, dir, fstype string, flags uintptr, data string, mode os.FileMode) error {
	if mounted(dir) {
		return nil
	}
	if err := os.MkdirAll(dir, mode); err != nil {
		return fmt.Errorf("mkdir %s: %w", dir, err)
	}
	if err := unix.Mount(src, dir, fstype, flags, data); err != nil {
		if fstype == "devpts" && errors.Is(err, unix.EINVAL) {
			return unix.Mount(src, dir, fstype, flags, "ptmxmode=0666,mode=0620")
		}
		return fmt.Errorf("mount %s on %s: %w", fstype, dir, err)
	}
	return nil
}

// mounted reports whether dir is a mount point (/proc/self/mountinfo's
// fifth field); false while /proc is not mounted.
func mounted(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && fs[4] == dir {
			return true
		}
	}
	return false
}

// consoleOnStdio gives shim /dev/console as stdin, stdout and stderr when
// the kernel could not (an initramfs without /dev/console).
func consoleOnStdio() {
	if _, err := unix.FcntlInt(2, unix.F_GETFD, 0); err == nil {
		return
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return
	}
	for i := 0; i < 3; i++ {
		unix.Dup2(fd, i)
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// enableControllers enables every controller of the root cgroup for its
// children: shim's cgroup root is /sys/fs/cgroup/shim in a VM (the root
// cgroup holds the kernel's threads).
func enableControllers(root string) {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		vmLog("cgroup2 controllers", "error", err)
		return
	}
	for _, c := range strings.Fields(string(b)) {
		if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
			vmLog("cgroup2 controller not enabled", "controller", c, "error", err)
		}
	}
}

// readVMConfig reads init.conf (absent is empty) and then the kernel
// command line's shim.NAME=VALUE words. VM-only names fill vmOpts; every
// other name is a shim init flag. shim's cgroup root defaults to
// /sys/fs/cgroup/shim (the root cgroup holds the kernel's threads).
func readVMConfig(confPath, cmdlinePath string) (vmOpts, error) {
	o := vmOpts{halt: "poweroff", flags: []string{"--cgroup-root=/sys/fs/cgroup/shim"}}
	var pairs [][2]string
	if b, err := os.ReadFile(confPath); err == nil {
		for i, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, _ := strings.Cut(line, "=")
			k = strings.TrimSpace(k)
			if k == "" || strings.ContainsAny(k, " \t") {
				return o, fmt.Errorf("%s:%d: want NAME=VALUE, not %q", confPath, i+1, line)
			}
			pairs = append(pairs, [2]string{k, strings.TrimSpace(v)})
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return o, err
	}
	if b, err := os.ReadFile(cmdlinePath); err == nil {
		for _, w := range splitCmdline(string(b)) {
			if rest, ok := strings.CutPrefix(w, "shim."); ok {
				k, v, _ := strings.Cut(rest, "=")
				pairs = append(pairs, [2]string{k, v})
			}
		}
	}
	for _, p := range pairs {
		k, v := p[0], p[1]
		switch {
		case k == "modules":
			o.modules = append(o.modules, strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' })...)
		case k == "hostname":
			o.hostname = v
		case k == "halt":
			if v != "poweroff" && v != "reboot" && v != "halt" {
				return o, fmt.Errorf("shim.halt=%q: want poweroff, reboot or halt", v)
			}
			o.halt = v
		case vmOnly[k]:
		default:
			o.flags = append(o.flags, "--"+k+"="+v)
		}
	}
	return o, nil
}

// splitCmdline splits a kernel command line into words as the kernel
// does: spaces separate them, double quotes keep spaces in one.
func splitCmdline(s string) []string {
	var words []string
	var b strings.Builder
	quoted := false
	for _, r := range strings.TrimSpace(s) {
		switch {
		case r == '"':
			quoted = !quoted
		case (r == ' ' || r == '\n' || r == '\t') && !quoted:
			if b.Len() > 0 {
				words = append(words, b.String())
				b.Reset()
			}
		default:
			b.WriteRune(r)
		}
	}
	if b.Len() > 0 {
		words = append(words, b.String())
	}
	return words
}

// powerOff syncs, remounts the root read-only where it can, and ends the
// machine: reboot(2) POWER_OFF, RESTART (Firecracker exits on the guest's
// reboot; it has no power-off) or HALT. It never returns.
func powerOff(how string) {
	unix.Sync()
	unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
	unix.Sync()
	cmd := unix.LINUX_REBOOT_CMD_POWER_OFF
	switch how {
	case "reboot":
		cmd = unix.LINUX_REBOOT_CMD_RESTART
	case "halt":
		cmd = unix.LINUX_REBOOT_CMD_HALT
	}
	err := unix.Reboot(cmd)
	vmLog("reboot(2) failed; PID 1 waits forever rather than panic the kernel", "error", err)
	select {}
}

func uptimeMS() int64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return -1
	}
	f, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		return -1
	}
	return int64(f * 1000)
}

// vmLog writes one line on the console, key=value pairs after the message.
func vmLog(msg string, kv ...any) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s [VM] shim: %s", time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), msg)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	fmt.Fprintln(os.Stderr, b.String())
}
