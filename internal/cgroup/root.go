package cgroup

// Choosing and validating the root: New picks the mode (cgroup2, cgroup1,
// pidns), resolves the root and refuses one shim must not own.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// New detects the mode, validates the root and creates it if missing. A
// root shim must not own is refused with Code CGROUP_ROOT_REFUSED; no
// usable mode is UNSUPPORTED. A refused explicit Config.Root never falls
// back to another mode; a refused default root (shim's own cgroup) does.
//
// With the default root, when shim is PID 1 of a container in a private
// cgroup namespace rooted at its own cgroup and holds CAP_SYS_ADMIN, New
// makes cgroup2 usable itself: it mounts cgroup2 where none is mounted
// (Docker on a cgroup v1 host, at SelfMountPoint or Config.MountDir) and
// remounts a read-only cgroup2 mount read-write (Docker on a cgroup v2
// host). In the host's cgroup namespace it never touches a mount. Reason
// names what is missing for cgroup2 and the `docker run` flags that give it.
func New(cfg Config, log hclog.Logger) (*Manager, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	h, err := probeHost()
	if err != nil {
		return nil, err
	}
	switch cfg.Mode {
	case ModeCgroup2:
		return prepareAndNewV2(cfg, h, log)
	case ModeCgroup1:
		return newV1(cfg, h, log, "forced")
	case ModePidns:
		return newPidns(cfg, h, log, "forced (--mode pidns); a fence sweeps shim's own pid namespace")
	case "":
	default:
		return nil, newError(CodeBadRequest, nil, fmt.Sprintf("unknown cgroup mode %q (want cgroup2, cgroup1 or pidns)", cfg.Mode))
	}
	// An explicit --cgroup-root that is refused is final: the operator named
	// it. shim's own cgroup may be refused in one hierarchy and fine in
	// another (Docker on a hybrid host: the unified cgroup is the host's
	// top, the freezer one is the container's), so then try the next mode.
	final := func(err error) bool { return cfg.Root != "" && CodeOf(err) == CodeRootRefused }
	m, err2 := prepareAndNewV2(cfg, h, log)
	if err2 == nil || final(err2) {
		return m, err2
	}
	m, err1 := newV1(cfg, h, log, "cgroup2 not usable: "+err2.Error()+h.hint())
	if err1 == nil || final(err1) {
		return m, err1
	}
	m, errp := newPidns(cfg, h, log, "no writable cgroup"+h.hint()+
		" (cgroup2: "+err2.Error()+"; cgroup1 freezer: "+err1.Error()+"); a fence sweeps shim's own pid namespace")
	if errp == nil {
		return m, nil
	}
	code := CodeUnsupported
	if CodeOf(err2) == CodeRootRefused || CodeOf(err1) == CodeRootRefused {
		code = CodeRootRefused
	}
	return nil, newError(code, nil, fmt.Sprintf(
		"no way to fence generations here: cgroup2: %v; cgroup1 freezer: %v; pidns: %v "+
			"(give shim a writable cgroup2 directory it owns with --cgroup-root, or run it as PID 1 of its own pid namespace)",
		err2, err1, errp))
}

// unusable is a mode that cannot work here (New tries the next one).
func unusable(format string, args ...any) error {
	return newError(CodeUnsupported, nil, fmt.Sprintf(format, args...))
}

func refused(format string, args ...any) error {
	return newError(CodeRootRefused, nil, fmt.Sprintf(format, args...))
}

// resolveRoot finds the root's filesystem and cgroup paths in mount mnt.
// own is shim's cgroup path in that hierarchy.
func resolveRoot(cfg Config, h *host, mnt *mountInfo, own string) (fsRoot, cg string, err error) {
	if cfg.Root == "" {
		if own == "" {
			return "", "", unusable("shim is in no cgroup of the %s hierarchy at %s", mnt.fstype, mnt.point)
		}
		cg = own
		if path.Base(cg) == ShimLeaf {
			cg = path.Dir(cg) // shim already adopted itself (re-exec)
		}
		fsRoot, ok := mnt.fsPath(cg)
		if !ok {
			return "", "", unusable("shim's cgroup %s is not visible under the mount %s (mount root %s); pass --cgroup-root", cg, mnt.point, mnt.root)
		}
		return fsRoot, cg, nil
	}
	if !filepath.IsAbs(cfg.Root) {
		return "", "", newError(CodeBadRequest, nil, fmt.Sprintf("--cgroup-root %q is not an absolute path", cfg.Root))
	}
	fsRoot = filepath.Clean(cfg.Root)
	if cg, ok := mnt.cgPath(fsRoot); ok {
		return fsRoot, cg, nil
	}
	// A cgroup2 path on a host where only the v1 freezer works: use the
	// same cgroup path in the freezer hierarchy.
	if mnt.fstype == "cgroup" && h.v2 != nil {
		if cg, ok := h.v2.cgPath(fsRoot); ok {
			if p, ok := mnt.fsPath(cg); ok {
				return p, cg, nil
			}
		}
	}
	return "", "", unusable("--cgroup-root %s is not under the %s mount at %s", fsRoot, mnt.fstype, mnt.point)
}

// ensureRoot creates root (and missing parents inside the mount) and
// returns the directories it created, deepest last, for rollback.
func ensureRoot(root, mountPoint string) ([]string, error) {
	var missing []string
	for d := root; d != mountPoint && d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		missing = append([]string{d}, missing...)
	}
	for i, d := range missing {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			rollback(missing[:i])
			return nil, err
		}
	}
	return missing, nil
}

func rollback(created []string) {
	for i := len(created) - 1; i >= 0; i-- {
		_ = os.Remove(created[i])
	}
}

// prepareAndNewV2 is newV2 after prepareV2, undoing the preparation when
// cgroup2 is still not usable, and saying in the error what shim tried.
func prepareAndNewV2(cfg Config, h *host, log hclog.Logger) (*Manager, error) {
	undo := prepareV2(cfg, h, log)
	m, err := newV2(cfg, h, log)
	if err == nil {
		return m, nil
	}
	if undo != nil {
		undo()
		log.Info("undid the cgroup2 mount change: cgroup2 still not usable", "error", err)
	}
	if CodeOf(err) == CodeUnsupported {
		return nil, unusable("%s", explainV2(err, h))
	}
	return nil, err
}

func newV2(cfg Config, h *host, log hclog.Logger) (*Manager, error) {
	if h.v2 == nil {
		return nil, unusable("no cgroup2 mount in /proc/self/mountinfo")
	}
	root, cg, err := resolveRoot(cfg, h, h.v2, h.self.unified)
	if err != nil {
		return nil, err
	}
	if err := refuseTop(root, cg, h, h.v2); err != nil {
		return nil, err
	}
	created, err := ensureRoot(root, h.v2.point)
	if err != nil {
		return nil, unusable("cannot create cgroup2 root %s: %v (is the cgroup2 mount writable? in a container use a private cgroup namespace and a rw /sys/fs/cgroup, or pass --cgroup-root)", root, err)
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.freeze")); err != nil {
		rollback(created)
		return nil, unusable("%s has no cgroup.freeze (kernel older than 5.2, or the host's top cgroup)", root)
	}
	if err := unix.Access(filepath.Join(root, "cgroup.procs"), unix.W_OK); err != nil {
		rollback(created)
		return nil, unusable("cgroup2 root %s is not writable: %v (read-only cgroupfs? give the container a writable cgroup2 mount or pass --cgroup-root)", root, err)
	}
	m := &Manager{mode: ModeCgroup2, root: root, rootCg: cg, mnt: *h.v2, log: log}
	if _, err := os.Stat(filepath.Join(root, "cgroup.kill")); err == nil {
		m.hasKill = true
	}
	if err := m.validateRoot(); err != nil {
		return nil, err
	}
	m.reason = fmt.Sprintf("cgroup2 at %s, root %s", h.v2.point, root)
	if h.prepared != "" {
		m.reason += " (" + h.prepared + ")"
	}
	if !m.hasKill {
		m.reason += " (no cgroup.kill: kill by freeze and SIGKILL each process)"
	}
	m.reason += h.netNote()
	log.Debug("cgroup mode", "mode", m.mode, "reason", m.reason)
	return m, nil
}

func newV1(cfg Config, h *host, log hclog.Logger, why string) (*Manager, error) {
	if h.freezer == nil {
		return nil, unusable("no v1 freezer hierarchy in /proc/self/mountinfo")
	}
	root, cg, err := resolveRoot(cfg, h, h.freezer, h.self.freezer)
	if err != nil {
		return nil, err
	}
	if err := refuseTop(root, cg, h, h.freezer); err != nil {
		return nil, err
	}
	created, err := ensureRoot(root, h.freezer.point)
	if err != nil {
		return nil, unusable("cannot create freezer cgroup %s: %v (read-only cgroupfs?)", root, err)
	}
	if _, err := os.Stat(filepath.Join(root, "freezer.state")); err != nil {
		rollback(created)
		return nil, unusable("%s has no freezer.state", root)
	}
	if err := unix.Access(filepath.Join(root, "cgroup.procs"), unix.W_OK); err != nil {
		rollback(created)
		return nil, unusable("freezer cgroup %s is not writable: %v", root, err)
	}
	m := &Manager{mode: ModeCgroup1, root: root, rootCg: cg, mnt: *h.freezer, log: log}
	if err := m.validateRoot(); err != nil {
		return nil, err
	}
	m.reason = fmt.Sprintf("cgroup1 freezer at %s, root %s (%s)", h.freezer.point, root, why) + h.netNote()
	log.Debug("cgroup mode", "mode", m.mode, "reason", m.reason)
	return m, nil
}

func newPidns(cfg Config, h *host, log hclog.Logger, why string) (*Manager, error) {
	if !h.pidnsInit {
		return nil, unusable("process sweep refused: shim is not PID 1 of a non-initial pid namespace (pid %d)", os.Getpid())
	}
	m := &Manager{mode: ModePidns, exempt: cfg.Exempt, log: log, virtual: map[string]*pidnsGroup{}}
	m.reason = "pidns: " + why + h.netNote()
	log.Debug("cgroup mode", "mode", m.mode, "reason", m.reason)
	return m, nil
}

// refuseTop refuses the host's top cgroup: cgroup path "/" seen from the
// initial cgroup namespace. ("/" of a private namespace is a container's
// own cgroup and fine.)
func refuseTop(root, cg string, h *host, mnt *mountInfo) error {
	if cg == "/" && h.initialNS {
		return refused("cgroup root %s is the host's top cgroup (path / in the initial cgroup namespace); "+
			"shim only fences inside a cgroup it owns: pass --cgroup-root with a dedicated directory such as %s, "+
			"or run shim in a container with a private cgroup namespace", root, filepath.Join(mnt.point, "shim-sandbox"))
	}
	return nil
}

// layoutName reports whether name is one of shim's own children of the
// root: "shim", "gen-<N>", "git-*", "tmp-*".
func layoutName(name string) bool {
	if name == ShimLeaf {
		return true
	}
	if n, ok := strings.CutPrefix(name, "gen-"); ok {
		_, err := strconv.ParseUint(n, 10, 64)
		return err == nil
	}
	for _, p := range []string{"git-", "tmp-"} {
		if rest, ok := strings.CutPrefix(name, p); ok && rest != "" && !strings.ContainsAny(rest, "/\x00") {
			return true
		}
	}
	return false
}

// validateRoot refuses a root that holds processes other than the caller
// or child cgroups outside shim's layout.
func (m *Manager) validateRoot() error {
	pids, err := readPids(filepath.Join(m.root, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("read %s/cgroup.procs: %w", m.root, err)
	}
	for _, p := range pids {
		if p != os.Getpid() {
			return refused("cgroup root %s holds process %d (%s) that is not shim; shim must own its cgroup root: "+
				"pass --cgroup-root with a new, empty directory", m.root, p, procComm(p))
		}
	}
	kids, err := subdirs(m.root)
	if err != nil {
		return fmt.Errorf("list %s: %w", m.root, err)
	}
	for _, k := range kids {
		if !layoutName(k) {
			return refused("cgroup root %s has child cgroup %q that shim did not create (shim's layout: shim, gen-<N>, git-*, tmp-*); "+
				"it looks like a shared or host cgroup: pass --cgroup-root with a new, empty directory", m.root, k)
		}
	}
	return nil
}
