package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// SelfMountPoint is where shim mounts cgroup2 itself when it runs as PID 1
// of a container that has none (Docker on a cgroup v1 or hybrid host mounts
// only the v1 hierarchies). Config.MountDir is the fallback when
// /sys/fs/cgroup cannot hold the directory.
const SelfMountPoint = "/sys/fs/cgroup/unified"

// mayMount says whether shim may mount or remount cgroup2 itself, or why
// not. It may only where the result can show nothing but its own subtree:
// PID 1 of a container (non-initial pid namespace) in a private cgroup
// namespace rooted at its own cgroup, holding CAP_SYS_ADMIN. On a host (the
// initial cgroup namespace) it never touches a mount.
func (h *host) mayMount() error {
	switch {
	case !h.pidnsInit:
		return errors.New("shim is not PID 1 of its own pid namespace")
	case h.initialNS:
		return errors.New("shim is in the host's cgroup namespace, where a cgroup2 mount would show the whole host")
	case h.self.unified != "/":
		return fmt.Errorf("shim's cgroup namespace is not rooted at its own cgroup (0::%s)", h.self.unified)
	case !h.sysAdmin:
		return errors.New("no CAP_SYS_ADMIN to mount cgroup2")
	}
	return nil
}

// prepareV2 gives shim a writable cgroup2 mount of its own cgroup
// namespace where it has none and mayMount allows it: it remounts a
// read-only cgroup2 mount read-write (Docker on a cgroup v2 host), or mounts
// cgroup2 at SelfMountPoint, else at cfg.MountDir (Docker on a cgroup v1 or
// hybrid host). It updates h.v2 and returns how to undo it (nil when it did
// nothing); what it did or why it could not goes to h.prepared and
// h.prepareErr. An explicit cfg.Root is never prepared: the operator chose
// it.
func prepareV2(cfg Config, h *host, log hclog.Logger) (undo func()) {
	if cfg.Root != "" || (h.v2 != nil && !h.v2.readOnly()) {
		return nil
	}
	if err := h.mayMount(); err != nil {
		h.prepareErr = err
		return nil
	}
	if h.v2 != nil {
		return remountV2(h, log)
	}
	candidates := []string{SelfMountPoint}
	if cfg.MountDir != "" && cfg.MountDir != SelfMountPoint {
		candidates = append(candidates, cfg.MountDir)
	}
	var errs []string
	for _, dir := range candidates {
		undo, err := mountV2(dir, h)
		if err == nil {
			h.prepared = "shim mounted cgroup2 at " + dir
			log.Info("mounted cgroup2 of the container's cgroup namespace", "at", dir)
			return undo
		}
		errs = append(errs, err.Error())
	}
	h.prepareErr = errors.New(strings.Join(errs, "; "))
	return nil
}

// mountV2 mounts cgroup2 at dir (created if missing) and checks that it
// shows shim's own cgroup namespace root only.
func mountV2(dir string, h *host) (func(), error) {
	created := false
	if err := os.Mkdir(dir, 0o755); err == nil {
		created = true
	} else if !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("create mount point %s: %w", dir, errors.Unwrap(err))
	}
	undo := func() {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		if created {
			_ = os.Remove(dir)
		}
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RELATIME, ""); err != nil {
		if created {
			_ = os.Remove(dir)
		}
		return nil, fmt.Errorf("mount cgroup2 at %s: %w", dir, err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		undo()
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var found *mountInfo
	for _, m := range parseMountinfo(mi) {
		if m.fstype == "cgroup2" && m.point == dir {
			m := m
			found = &m // the last one is on top
		}
	}
	if found == nil || found.root != "/" {
		undo()
		root := "nothing"
		if found != nil {
			root = found.root
		}
		return nil, fmt.Errorf("cgroup2 mounted at %s shows %s, not shim's cgroup namespace root", dir, root)
	}
	h.v2 = found
	return undo, nil
}

// remountV2 makes the read-only cgroup2 mount h.v2 read-write. It changes
// only this mount's flags (MS_BIND), keeping the others (Linux refuses to
// drop nosuid/nodev/noexec locked by a user namespace anyway).
func remountV2(h *host, log hclog.Logger) func() {
	m := *h.v2
	if m.root != "/" {
		h.prepareErr = fmt.Errorf("the read-only cgroup2 mount at %s shows %s, not shim's cgroup namespace root", m.point, m.root)
		return nil
	}
	flags := mountFlags(m.mountOpts)
	if err := unix.Mount("", m.point, "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil {
		h.prepareErr = fmt.Errorf("remount %s read-write: %w", m.point, err)
		return nil
	}
	var opts []string
	for _, o := range m.mountOpts {
		if o == "ro" {
			o = "rw"
		}
		opts = append(opts, o)
	}
	m.mountOpts = opts
	h.v2 = &m
	h.prepared = "shim remounted the read-only cgroup2 mount " + m.point + " read-write"
	log.Info("remounted cgroup2 read-write", "at", m.point)
	return func() { _ = unix.Mount("", m.point, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|flags, "") }
}

// mountFlags maps mountinfo per-mount options to MS_* flags (without
// MS_RDONLY).
func mountFlags(opts []string) uintptr {
	var f uintptr
	for _, o := range opts {
		switch o {
		case "nosuid":
			f |= unix.MS_NOSUID
		case "nodev":
			f |= unix.MS_NODEV
		case "noexec":
			f |= unix.MS_NOEXEC
		case "noatime":
			f |= unix.MS_NOATIME
		case "nodiratime":
			f |= unix.MS_NODIRATIME
		case "relatime":
			f |= unix.MS_RELATIME
		case "strictatime":
			f |= unix.MS_STRICTATIME
		}
	}
	return f
}

// cgroup2Flags names the `docker run` flags that would give shim cgroup2
// mode; nil when shim is not a container's PID 1 or the flags are there.
func (h *host) cgroup2Flags() []string {
	if !h.pidnsInit {
		return nil
	}
	var f []string
	if !h.sysAdmin {
		f = append(f, "--cap-add SYS_ADMIN")
	}
	if h.initialNS {
		f = append(f, "--cgroupns=private")
	}
	if len(f) == 0 && (errors.Is(h.prepareErr, unix.EPERM) || errors.Is(h.prepareErr, unix.EACCES)) {
		// CAP_SYS_ADMIN and a private cgroup namespace, yet mount is
		// denied: a security profile (AppArmor's docker-default denies mount).
		f = append(f, "--security-opt apparmor=unconfined")
	}
	return f
}

// hint is "; run with FLAGS for cgroup2", or what else would give it, or
// "" when nothing would help.
func (h *host) hint() string {
	if h.noCgroup {
		// gVisor: no flag of the runtime gives a cgroup.
		// gVisor's SO_PEERCRED (runsc 20221219) reports the listener's own
		// credentials for every peer: the control socket's peer check
		// sees each peer as shim (images/README.md, the runtime matrix).
		return "; this kernel has no cgroups at all (/proc/self/cgroup is empty, as under gVisor's runsc): no run flag gives cgroup2 here" +
			"; under gVisor SO_PEERCRED may report shim's own credentials for every peer (runsc 20221219 does), " +
			"leaving the control socket's file mode as its only uid check: run harnesses as a non-root uid"
	}
	if f := h.cgroup2Flags(); len(f) > 0 {
		return "; run with " + strings.Join(f, " ") + " for cgroup2"
	}
	if h.userNS && h.pidnsInit {
		return "; in a user namespace (rootless) a container has a cgroup of its own only where the host delegates one: " +
			"run it on a cgroup v2 host under systemd (podman's cgroup manager; user@.service has Delegate=yes) for cgroup2"
	}
	return ""
}

// netNote says what per-generation networks (netns, veth) lack in a
// container, "" when nothing or not in a container.
func (h *host) netNote() string {
	if !h.pidnsInit || (h.sysAdmin && h.netAdmin) {
		return ""
	}
	var f []string
	if !h.sysAdmin {
		f = append(f, "--cap-add SYS_ADMIN")
	}
	if !h.netAdmin {
		f = append(f, "--cap-add NET_ADMIN")
	}
	return "; per-generation networks (--network isolated|none) need " + strings.Join(f, " ")
}

// explainV2 adds to a cgroup2 failure what shim tried to get a writable
// cgroup2 mount, or why it did not.
func explainV2(err error, h *host) string {
	msg := err.Error()
	if h.prepareErr != nil {
		if h.v2 == nil {
			msg += ", and shim did not mount one: " + h.prepareErr.Error()
		} else {
			msg += "; shim did not remount it read-write: " + h.prepareErr.Error()
		}
	}
	return msg
}
