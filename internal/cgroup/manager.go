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
