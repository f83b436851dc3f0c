package cgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Inode numbers of the initial namespaces (include/linux/proc_ns.h). A
// process whose /proc/self/ns/<type> has this inode is in the host's
// namespace of that type.
const (
	initialPidNSIno    = 0xEFFFFFFC
	initialCgroupNSIno = 0xEFFFFFFB
)

// mountInfo is one cgroup mount from /proc/self/mountinfo.
type mountInfo struct {
	point     string   // where it is mounted
	root      string   // the cgroup path (in our cgroup namespace) shown at point
	fstype    string   // "cgroup2" or "cgroup"
	mountOpts []string // per-mount options, e.g. ["ro", "nosuid", "nodev"]
	superOpts []string // e.g. ["rw", "freezer"]
}

// readOnly reports whether this mount (not the filesystem) is read-only,
// as Docker mounts cgroupfs into unprivileged containers.
func (m mountInfo) readOnly() bool {
	for _, o := range m.mountOpts {
		if o == "ro" {
			return true
		}
	}
	return false
}

func (m mountInfo) hasOpt(o string) bool {
	for _, s := range m.superOpts {
		if s == o {
			return true
		}
	}
	return false
}

// fsPath maps a cgroup path (as in /proc/<pid>/cgroup) to a filesystem path
// under this mount; ok is false when the cgroup is not visible through it.
func (m mountInfo) fsPath(cg string) (string, bool) {
	rel, ok := under(m.root, cg)
	if !ok {
		return "", false
	}
	return filepath.Join(m.point, rel), true
}

// cgPath maps a filesystem path under this mount to its cgroup path.
func (m mountInfo) cgPath(fs string) (string, bool) {
	rel, err := filepath.Rel(m.point, filepath.Clean(fs))
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return path.Join(m.root, rel), true
}

// under reports whether cg is base or below it, and the remainder ("." for
// base itself).
func under(base, cg string) (string, bool) {
	// A cgroup outside our cgroup namespace shows as "/../..."; Clean
	// would silently turn that into a path inside it.
	if strings.Contains(cg+"/", "/../") || !strings.HasPrefix(cg, "/") {
		return "", false
	}
	base, cg = path.Clean(base), path.Clean(cg)
	if base == cg {
		return ".", true
	}
	if base == "/" {
		return strings.TrimPrefix(cg, "/"), strings.HasPrefix(cg, "/")
	}
	if strings.HasPrefix(cg, base+"/") {
		return cg[len(base)+1:], true
	}
	return "", false
}

// parseMountinfo returns the cgroup and cgroup2 mounts of a mountinfo file.
func parseMountinfo(data []byte) []mountInfo {
	var out []mountInfo
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) < 6 || len(g) < 3 {
			continue
		}
		if g[0] != "cgroup" && g[0] != "cgroup2" {
			continue
		}
		out = append(out, mountInfo{
			point:     unescapeMount(f[4]),
			root:      unescapeMount(f[3]),
			fstype:    g[0],
			mountOpts: strings.Split(f[5], ","),
			superOpts: strings.Split(g[2], ","),
		})
	}
	return out
}

// unescapeMount undoes the octal escapes (\040 etc.) of mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// procCgroups is a parsed /proc/<pid>/cgroup.
type procCgroups struct {
	unified string // the "0::" path, "" when absent
	freezer string // the v1 freezer path, "" when absent
}

func parseProcCgroup(data []byte) procCgroups {
	var pc procCgroups
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			pc.unified = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "freezer" {
				pc.freezer = parts[2]
			}
		}
	}
	return pc
}

func readProcCgroup(pid int) (procCgroups, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return procCgroups{}, err
	}
	return parseProcCgroup(data), nil
}

// host is what New learns about the machine before choosing a mode.
type host struct {
	v2        *mountInfo // preferred cgroup2 mount
	freezer   *mountInfo // v1 freezer mount
	self      procCgroups
	initialNS bool // in the initial cgroup namespace
	pidnsInit bool // PID 1 of a non-initial pid namespace
	sysAdmin  bool // CAP_SYS_ADMIN in the effective set
	netAdmin  bool // CAP_NET_ADMIN in the effective set
	noCgroup  bool // /proc/self/cgroup is empty: a kernel without cgroups (gVisor)
	userNS    bool // in a non-initial user namespace (rootless podman)

	// Set by prepareV2: what shim did or could not do to get a writable
	// cgroup2 mount of its own (for Reason).
	prepared   string
	prepareErr error
}

func probeHost() (*host, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	h := &host{}
	for _, m := range parseMountinfo(mi) {
		m := m
		switch {
		case m.fstype == "cgroup2":
			// Prefer the canonical location; otherwise the first one.
			if h.v2 == nil || m.point == "/sys/fs/cgroup" {
				h.v2 = &m
			}
		case m.hasOpt("freezer"):
			if h.freezer == nil {
				h.freezer = &m
			}
		}
	}
	if h.self, err = readProcCgroup(os.Getpid()); err != nil {
		return nil, fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	h.initialNS = nsIno("cgroup") == initialCgroupNSIno
	h.pidnsInit = os.Getpid() == 1 && nsIno("pid") != initialPidNSIno
	h.sysAdmin, h.netAdmin = hasCap(unix.CAP_SYS_ADMIN), hasCap(unix.CAP_NET_ADMIN)
	if data, err := os.ReadFile("/proc/self/cgroup"); err == nil && len(strings.TrimSpace(string(data))) == 0 {
		h.noCgroup = true
	}
	if data, err := os.ReadFile("/proc/self/uid_map"); err == nil {
		h.userNS = !isIdentityMap(data)
	}
	return h, nil
}

// isIdentityMap reports whether a uid_map is the initial user namespace's
// ("0 0 4294967295").
func isIdentityMap(data []byte) bool {
	f := strings.Fields(string(data))
	return len(f) == 3 && f[0] == "0" && f[1] == "0" && f[2] == "4294967295"
}

// hasCap reports whether capability c is in the effective set of this
// process (from /proc/self/status; false when unreadable).
func hasCap(c int) bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	return capEffHas(data, c)
}

func capEffHas(status []byte, c int) bool {
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && c >= 0 && c < 64 && n&(1<<uint(c)) != 0
		}
	}
	return false
}

// nsIno returns the inode of /proc/self/ns/<kind>, 0 when unreadable. An
// unreadable namespace counts as initial for the callers (fail closed).
func nsIno(kind string) uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/"+kind, &st); err != nil {
		switch kind {
		case "pid":
			return initialPidNSIno
		case "cgroup":
			return initialCgroupNSIno
		}
		return 0
	}
	return st.Ino
}
