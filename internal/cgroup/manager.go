// Package cgroup gives every generation of shim its own cgroup and fences
// it: create, place, freeze, kill until empty, remove, and resource limits.
//
// Three modes, chosen by New (best first):
//
//   - cgroup2: a writable cgroup2 directory shim owns (the root) with
//     cgroup.freeze; cgroup.kill (Linux 5.14) when present.
//   - cgroup1: the v1 freezer hierarchy (Docker on cgroup v1 hosts). Kill is
//     freeze, SIGKILL every pid, thaw, until empty. No resource limits.
//   - pidns: no usable cgroup, but shim is PID 1 of its own pid namespace:
//     groups are virtual and a fence sweeps every process of the namespace.
//
// Safety: the package only ever freezes, kills or removes cgroups below the
// root it validated (never the host's top cgroup, never a root holding
// processes or cgroups shim did not create), signals only processes it has
// confirmed (through a pidfd) to be inside the group, and never waits for
// any process: the reaper is elsewhere.
package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Mode is how generations are isolated and fenced.
type Mode string

// The fencing modes, reported by `shim ctl status` as "mode".
const (
	ModeCgroup2 Mode = "cgroup2"
	ModeCgroup1 Mode = "cgroup1" // v1 freezer hierarchy
	ModePidns   Mode = "pidns"   // no usable cgroups: sweep every process of the pid namespace
)

// ShimLeaf is the child of the root that holds shim itself (AdoptSelf).
const ShimLeaf = "shim"

// Config selects the cgroup root and mode.
type Config struct {
	// Root is the filesystem path of a cgroup directory shim owns (created
	// if missing). "" means shim's own cgroup (from /proc/self/cgroup),
	// which is right in a container with a private cgroup namespace; when
	// shim already sits in a leaf named "shim", its parent.
	Root string
	// Mode forces a mode; "" detects the best (cgroup2 > cgroup1 > pidns).
	Mode Mode
	// Exempt names processes a pidns sweep must spare (the service
	// command); may be nil. Unused in cgroup modes.
	Exempt func(pid int) bool
	// MountDir is where shim mounts cgroup2 itself when SelfMountPoint
	// (/sys/fs/cgroup/unified) cannot be created, e.g. <runtime-dir>/cgroup2;
	// "" = SelfMountPoint only. See New.
	MountDir string
}

// Limits are resource limits of a group (cgroup2 only).
type Limits struct {
	MemoryMax int64  // bytes; 0 = none
	PidsMax   int64  // 0 = none
	CPUMax    string // cpu.max format "QUOTA PERIOD" or "max 100000"; "" = none
}

// Manager owns the cgroup root and creates the groups below it. It and the
// Groups it returns are safe for concurrent use (Groups are stateless
// handles on a directory; any number may refer to the same group).
type Manager struct {
	mode    Mode
	root    string    // filesystem path; "" in pidns mode
	rootCg  string    // root as a cgroup path in our cgroup namespace
	mnt     mountInfo // the hierarchy root lives in
	hasKill bool      // cgroup2 root offers cgroup.kill
	reason  string
	exempt  func(int) bool
	log     hclog.Logger

	mu      sync.Mutex
	virtual map[string]*pidnsGroup // pidns mode: the groups created
}

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

// Mode returns the fencing mode in use.
func (m *Manager) Mode() Mode { return m.mode }

// Root returns the absolute path of the cgroup root ("" in pidns mode).
func (m *Manager) Root() string { return m.root }

// Reason says in one line why this mode and root were chosen.
func (m *Manager) Reason() string { return m.reason }

// AdoptSelf moves the calling process (all its threads) into <root>/shim so
// that generations can be its siblings, then enables the cpu, memory and
// pids controllers for the root's children where available (others are
// skipped and logged). Call it before starting any process: cgroup2 only
// enables controllers for children of a cgroup that holds no process. A
// no-op in pidns mode.
func (m *Manager) AdoptSelf() error {
	if m.mode == ModePidns {
		return nil
	}
	leaf := filepath.Join(m.root, ShimLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create %s: %w", leaf, err)
	}
	if err := writeFile(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(os.Getpid())); err != nil {
		return fmt.Errorf("move shim into %s: %w", leaf, err)
	}
	if m.mode != ModeCgroup2 {
		return nil
	}
	avail, _ := os.ReadFile(filepath.Join(m.root, "cgroup.controllers"))
	have := strings.Fields(string(avail))
	for _, c := range []string{"cpu", "memory", "pids"} {
		if !contains(have, c) {
			m.log.Debug("controller not available in cgroup root", "controller", c, "root", m.root)
			continue
		}
		if err := writeFile(filepath.Join(m.root, "cgroup.subtree_control"), "+"+c); err != nil {
			m.log.Warn("cannot enable controller for generations", "controller", c, "root", m.root, "error", err)
		}
	}
	return nil
}

// Controllers reports which controllers generation cgroups get (those
// enabled in the root's cgroup.subtree_control); none outside cgroup2.
func (m *Manager) Controllers() map[string]bool {
	out := map[string]bool{}
	if m.mode != ModeCgroup2 {
		return out
	}
	b, _ := os.ReadFile(filepath.Join(m.root, "cgroup.subtree_control"))
	for _, c := range strings.Fields(string(b)) {
		out[c] = true
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkName accepts the names Create and Open may use: shim's layout
// except the shim leaf itself.
func checkName(name string) error {
	if name == ShimLeaf || !layoutName(name) {
		return newError(CodeBadRequest, nil, fmt.Sprintf("invalid group name %q (want gen-<N>, git-* or tmp-*)", name))
	}
	return nil
}

// Create makes the group <root>/<name> with the given limits. It fails if
// the group exists (an error matching fs.ErrExist). A limit whose controller
// is not available fails with Code CONTROLLER_MISSING and leaves nothing
// behind.
func (m *Manager) Create(name string, l Limits) (Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	files, err := l.files()
	if err != nil {
		return nil, err
	}
	switch m.mode {
	case ModePidns:
		if len(files) > 0 {
			return nil, newError(CodeControllerMissing, nil, fmt.Sprintf(
				"controller %s missing: pidns mode has no cgroups, so no resource limits; drop the limit or give shim a cgroup2 root (--cgroup-root)", files[0].ctrl))
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.virtual[name]; ok {
			return nil, fmt.Errorf("group %s: %w", name, fs.ErrExist)
		}
		g := &pidnsGroup{m: m, name: name}
		m.virtual[name] = g
		return g, nil
	case ModeCgroup1:
		if len(files) > 0 {
			return nil, newError(CodeControllerMissing, nil, fmt.Sprintf(
				"controller %s missing: cgroup1 (freezer) mode applies no resource limits; drop the limit or give shim a cgroup2 root with the controller (--cgroup-root)", files[0].ctrl))
		}
	case ModeCgroup2:
		data, err := os.ReadFile(filepath.Join(m.root, "cgroup.subtree_control"))
		if err != nil {
			return nil, err
		}
		enabled := strings.Fields(string(data))
		for _, f := range files {
			if !contains(enabled, f.ctrl) {
				return nil, m.controllerMissing(f.ctrl)
			}
		}
	}
	p := filepath.Join(m.root, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		return nil, fmt.Errorf("create group: %w", err)
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(p, f.file), f.val); err != nil {
			_ = os.Remove(p)
			return nil, newError(CodeBadRequest, err, "set limit "+f.file)
		}
	}
	return m.group(name), nil
}

// controllerMissing explains why controller c is not enabled for the root's
// children and how to fix it.
func (m *Manager) controllerMissing(c string) error {
	avail, _ := os.ReadFile(filepath.Join(m.root, "cgroup.controllers"))
	have := strings.Fields(string(avail))
	if contains(have, c) {
		return newError(CodeControllerMissing, nil, fmt.Sprintf(
			"controller %s is available in %s but not enabled for its children: shim enables it at startup (AdoptSelf), "+
				"which fails while the root holds other processes; write +%s to %s/cgroup.subtree_control",
			c, m.root, c, m.root))
	}
	return newError(CodeControllerMissing, nil, fmt.Sprintf(
		"controller %s is not available in cgroup root %s (available: %q): enable it in every ancestor's cgroup.subtree_control "+
			"(on a hybrid cgroup v1/v2 host it is bound to a v1 hierarchy; boot with systemd.unified_cgroup_hierarchy=1), or drop the limit",
		c, m.root, strings.Join(have, " ")))
}

type limitFile struct{ ctrl, file, val string }

// Validate checks the limits' values (not whether their controllers are
// there): the check Create makes first.
func (l Limits) Validate() error {
	_, err := l.files()
	return err
}

// files validates the limits and returns the control files to write.
func (l Limits) files() ([]limitFile, error) {
	var out []limitFile
	if l.MemoryMax < 0 || l.PidsMax < 0 {
		return nil, newError(CodeBadRequest, nil, "negative limit")
	}
	if l.MemoryMax > 0 {
		out = append(out, limitFile{"memory", "memory.max", strconv.FormatInt(l.MemoryMax, 10)})
	}
	if l.PidsMax > 0 {
		out = append(out, limitFile{"pids", "pids.max", strconv.FormatInt(l.PidsMax, 10)})
	}
	if l.CPUMax != "" {
		f := strings.Fields(l.CPUMax)
		ok := len(f) >= 1 && len(f) <= 2
		if ok && f[0] != "max" {
			n, err := strconv.ParseUint(f[0], 10, 63)
			ok = err == nil && n > 0
		}
		if ok && len(f) == 2 {
			n, err := strconv.ParseUint(f[1], 10, 63)
			ok = err == nil && n > 0
		}
		if !ok {
			return nil, newError(CodeBadRequest, nil, fmt.Sprintf("cpu max %q: want \"QUOTA PERIOD\" or \"max PERIOD\" (microseconds)", l.CPUMax))
		}
		out = append(out, limitFile{"cpu", "cpu.max", strings.Join(f, " ")})
	}
	return out, nil
}

func (m *Manager) group(name string) Group {
	p := filepath.Join(m.root, name)
	cg := path.Join(m.rootCg, name)
	if m.mode == ModeCgroup1 {
		return &v1Group{name: name, path: p, cg: cg}
	}
	return &v2Group{name: name, path: p, cg: cg, hasKill: m.hasKill}
}

// Open returns an existing group, e.g. a gen-N left by a previous shim
// process; Code NOT_FOUND when it does not exist.
func (m *Manager) Open(name string) (Group, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if m.mode == ModePidns {
		m.mu.Lock()
		defer m.mu.Unlock()
		if g, ok := m.virtual[name]; ok {
			return g, nil
		}
		return nil, newError(CodeNotFound, nil, "no group "+name)
	}
	if st, err := os.Stat(filepath.Join(m.root, name)); err != nil || !st.IsDir() {
		return nil, newError(CodeNotFound, err, "no group "+name+" in "+m.root)
	}
	return m.group(name), nil
}

// List returns the names of the root's children except the shim leaf,
// sorted.
func (m *Manager) List() ([]string, error) {
	var names []string
	if m.mode == ModePidns {
		m.mu.Lock()
		for n := range m.virtual {
			names = append(names, n)
		}
		m.mu.Unlock()
	} else {
		kids, err := subdirs(m.root)
		if err != nil {
			return nil, err
		}
		for _, k := range kids {
			if k != ShimLeaf {
				names = append(names, k)
			}
		}
	}
	sort.Strings(names)
	return names, nil
}

// GroupOf says which child of the root pid lives in: "" when it is outside
// the root (or in the root itself), "shim" for the shim leaf, "gen-3" etc.
// In pidns mode it is always "". A pid that does not exist is an error.
func (m *Manager) GroupOf(pid int) (string, error) {
	if m.mode == ModePidns {
		return "", nil
	}
	pc, err := readProcCgroup(pid)
	if err != nil {
		return "", err
	}
	cg := pc.unified
	if m.mode == ModeCgroup1 {
		cg = pc.freezer
	}
	rel, ok := under(m.rootCg, cg)
	if !ok || rel == "." {
		return "", nil
	}
	first, _, _ := strings.Cut(rel, "/")
	return first, nil
}

// removeTree removes dir and its descendant cgroups, deepest first. It
// fails (EBUSY) while any of them holds a process; it never kills.
func removeTree(dir string) error {
	kids, err := subdirs(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, k := range kids {
		if err := removeTree(filepath.Join(dir, k)); err != nil {
			return err
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}
