package layers

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

func jsonPlan(p *Plan) (string, error) {
	b, err := json.Marshal(p)
	return string(b), err
}

// fresh mounts: paths that, where they are a mount of their own, get an
// empty one per generation instead of the sandbox's (what a fresh
// container would have).
var freshTmpfs = []string{"/tmp", "/var/tmp", "/dev/shm", "/run/user"}

// RunStub is the layer stub's main, run as root in the generation's new
// mount and IPC namespaces. Its arguments are either fd:N, a unix socket
// on which it waits for its Launch (Command: the stub is started before
// the generation may run, beside the fence of the one before), or PLAN
// PATH ARGV... (the plan as JSON: the start-up probe). It mounts the
// worktree layers and the root layer, pivots into it, drops to the
// harness's credentials and execs it. Nothing of this reaches shim's mount
// namespace: the first thing it does is make every mount private.
func RunStub(args []string) int {
	if len(args) == 1 && strings.HasPrefix(args[0], "fd:") {
		return runLaunched(args[0])
	}
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "shim: layer stub: missing arguments")
		return 127
	}
	var p Plan
	if err := json.Unmarshal([]byte(args[0]), &p); err != nil {
		fmt.Fprintf(os.Stderr, "shim: layer stub: plan: %v\n", err)
		return 127
	}
	return p.run(openMountNS(), args[1], args[2:], os.Environ())
}

// runLaunched is the stub started before its generation may run: it
// makes its mounts private, receives its plan (Prepare) and mounts the
// root layer, then waits on the socket (fd:N) for its Launch and the
// harness's stdout and stderr, mounts the worktree layers and execs the
// harness; a socket closed before either (the start was given up) ends
// it.
func runLaunched(arg string) int {
	fd, err := strconv.Atoi(strings.TrimPrefix(arg, "fd:"))
	if err != nil || fd < 3 {
		fmt.Fprintf(os.Stderr, "shim: layer stub: bad socket %q\n", arg)
		return 127
	}
	nsfd := openMountNS()
	if err := kernel.mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		unix.Write(fd, []byte("make mounts private: "+err.Error()))
		return 127
	}
	prep, err := prepare(fd)
	if err != nil {
		unix.Write(fd, []byte(err.Error()))
		return 127
	}
	m, files, err := receiveLaunch(fd)
	if err == nil && !sameMounts(prep, m.Plan) {
		err = errors.New("launch: its plan mounts other layers than the one prepared")
	}
	if err != nil {
		unix.Write(fd, []byte(err.Error()))
		return 127
	}
	for i, f := range files {
		if err := unix.Dup3(f, 1+i, 0); err != nil {
			unix.Write(fd, []byte("harness output: "+err.Error()))
			return 127
		}
		unix.Close(f)
	}
	m.Plan.Ready, m.Plan.prepared = fd, true
	return m.Plan.run(nsfd, m.Path, m.Argv, m.Env)
}

// openMountNS opens the stub's mount namespace while it is still root
// (shim cannot open a process's namespace once it runs as another uid
// without CAP_SYS_PTRACE, which a container does not have): handed to shim
// with the report, so that the layers outlive the harness's last process
// (see Plan.Ready). -1 when it cannot.
func openMountNS() int {
	fd, err := unix.Open("/proc/self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

// run mounts p's layers, enters them as the harness and execs path.
func (p *Plan) run(nsfd int, path string, argv, env []string) int {
	fail := func(format string, args ...any) int {
		msg := fmt.Sprintf(format, args...)
		if p.Ready > 0 {
			unix.Write(p.Ready, []byte(msg))
		}
		fmt.Fprintf(os.Stderr, "shim: %s\n", msg)
		return 127
	}
	mount := p.mount
	if p.prepared {
		mount = p.mountLaunched
	}
	if err := mount(); err != nil {
		return fail("layers of generation %d: %v", p.Generation, err)
	}
	if err := p.enter(); err != nil {
		return fail("generation %d: %v", p.Generation, err)
	}
	// No way back to privileges: no setuid or file capability raises
	// them from here on (with nosuid on the layers, also for binaries of
	// bound-in mounts).
	if p.SetCred {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fail("generation %d: no_new_privs: %v", p.Generation, err)
		}
	}
	// Only stdin, stdout and stderr reach the harness: whatever shim
	// inherited from its own parent without close-on-exec stays behind.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fail("generation %d: close inherited files: %v", p.Generation, err)
	}
	if p.Ready > 0 {
		if nsfd >= 0 {
			// "M" and the namespace: mounted (an error would be its text).
			// Its IPC namespace comes along, for the tool calls shim runs
			// in the generation (they enter both).
			fds := []int{nsfd}
			if ipc, err := unix.Open("/proc/self/ns/ipc", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				fds = append(fds, ipc)
			}
			unix.Sendmsg(p.Ready, []byte{'M'}, unix.UnixRights(fds...), nil, 0)
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
		unix.Close(p.Ready)
	}
	err := unix.Exec(path, argv, env)
	fmt.Fprintf(os.Stderr, "shim: exec %s: %v\n", path, err)
	return 127
}

// mount builds the generation's view: worktree overlays in place, then the
// root overlay with the sandbox's other mounts bound back in, then the
// pivot into it.
func (p *Plan) mount() error {
	if err := kernel.mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := p.mountWorktrees(); err != nil {
		return err
	}
	if p.Root == nil {
		return nil
	}
	if err := p.mountRoot(nil); err != nil {
		return err
	}
	return p.bindAndPivot(nil)
}

// mountWorktrees mounts each worktree's overlay on its path.
func (p *Plan) mountWorktrees() error {
	for _, w := range p.Worktrees {
		if err := overlay(w.Path, w.Path, w.Upper, w.Work); err != nil {
			return fmt.Errorf("worktree layer on %s: %w", w.Path, err)
		}
	}
	return nil
}

// mountRoot mounts the root overlay and binds the sandbox's mounts back
// in (fresh tmpfs for /tmp and /dev/shm, a fresh message queue, what was
// below a fresh one carried over), except what is hidden: the layers, the
// merged root, and the paths in also.
func (p *Plan) mountRoot(also []string) error {
	r := p.Root
	if p.RootTmpfs != "" {
		if err := kernel.mount("shim-probe", p.RootTmpfs, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size=1m"); err != nil {
			return fmt.Errorf("tmpfs for the root layer: %w", err)
		}
		for _, d := range []string{r.Upper, r.Work, r.Merged} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return err
			}
		}
	}
	if err := overlay(r.Merged, "/", r.Upper, r.Work); err != nil {
		return fmt.Errorf("root layer: %w", err)
	}
	ms, err := kernel.mountinfo("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	hidden := append(append(append([]string{}, p.Hide...), r.Merged), also...)
	fresh := map[string]bool{} // the mounts a fresh tmpfs replaces, by id
	for _, m := range topLevel(ms) {
		if under(m.point, hidden) || m.point == "/" {
			continue
		}
		dst := filepath.Join(r.Merged, m.point)
		if contains(freshTmpfs, m.point) {
			if err := kernel.mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
				return fmt.Errorf("fresh %s: %w", m.point, err)
			}
			fresh[m.id] = true
			continue
		}
		if err := kernel.mount(m.point, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", m.point, err)
		}
	}
	// Below a bound mount (/dev of a container): an empty /dev/shm, and
	// a message-queue filesystem of the new IPC namespace.
	for _, m := range ms {
		dst := filepath.Join(r.Merged, m.point)
		switch {
		case m.point == "/" || under(m.point, hidden) || isTopLevel(m, ms):
		case contains(freshTmpfs, m.point):
			if err := kernel.mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
				return fmt.Errorf("fresh %s: %w", m.point, err)
			}
			fresh[m.id] = true
		case m.fstype == "mqueue":
			if err := kernel.mount("mqueue", dst, "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
				return fmt.Errorf("fresh %s: %w", m.point, err)
			}
		}
	}
	// A fresh tmpfs covers what the sandbox had mounted below it (a
	// worktree's layer under /tmp, a volume under /dev/shm): each comes
	// back where it was, with its own submounts.
	for _, m := range carriedMounts(ms, fresh, hidden) {
		if err := bindAt(m.point, filepath.Join(r.Merged, m.point)); err != nil {
			return fmt.Errorf("bind %s: %w", m.point, err)
		}
	}
	return nil
}

// bindAndPivot binds first (the worktree overlays of a prepared root)
// and the paths shim needs inside into the merged root, then pivots into
// it.
func (p *Plan) bindAndPivot(first []string) error {
	r := p.Root
	hidden := append(append([]string{}, p.Hide...), r.Merged)
	for _, b := range append(append([]string{}, first...), p.Bind...) {
		if b == "" || under(b, hidden) {
			continue
		}
		if err := bindAt(b, filepath.Join(r.Merged, b)); err != nil {
			return fmt.Errorf("bind %s: %w", b, err)
		}
	}
	return kernel.pivot(r.Merged)
}

// carriedMounts are the mounts right below one a fresh tmpfs replaces
// (except another fresh one and the hidden), outermost first, each point
// once.
func carriedMounts(ms []mountEntry, fresh map[string]bool, hidden []string) []mountEntry {
	var out []mountEntry
	seen := map[string]bool{}
	for _, m := range ms {
		if !fresh[m.parent] || seen[m.point] || contains(freshTmpfs, m.point) || under(m.point, hidden) {
			continue
		}
		seen[m.point] = true
		out = append(out, m)
	}
	sort.SliceStable(out, func(i, j int) bool { return depth(out[i].point) < depth(out[j].point) })
	return out
}

// bindAt binds src (with its submounts) on dst, making dst first where it
// is missing (below a fresh tmpfs): a directory, or an empty file for a
// file.
func bindAt(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(dst); os.IsNotExist(err) {
		if st.IsDir() {
			err = os.MkdirAll(dst, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
		if err != nil {
			return err
		}
	}
	return kernel.mount(src, dst, "", unix.MS_BIND|unix.MS_REC, "")
}

// overlay mounts an overlay of lower and upper on target. redirect_dir,
// index and metacopy are off: every file of the upper holds all of its
// data and a renamed directory is copied, so the layer can be read as a
// plain tree.
func overlay(target, lower, upper, work string) error {
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,index=off,metacopy=off",
		escapeOpt(lower), escapeOpt(upper), escapeOpt(work))
	// nosuid and nodev: a setuid binary of the lower (su, mount) runs
	// as the harness, and no device node a layer holds opens.
	return kernel.mount("shim-layer", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts)
}

// escapeOpt escapes what overlayfs parses in a path option.
func escapeOpt(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `,`, `\,`, `:`, `\:`)
	return r.Replace(s)
}

// pivot makes root the root of the namespace: pivot_root(".", ".") and a
// detach of the old root, as runc does; where pivot_root is refused
// (Docker's default seccomp profile) the merged root is moved over / and
// chrooted into, as runc's no_pivot_root does. Either way the harness,
// unprivileged, has no way back to the old root.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err == nil {
		if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
			return fmt.Errorf("detach the old root: %w", err)
		}
		return unix.Chdir("/")
	} else if err != unix.EPERM && err != unix.EINVAL && err != unix.ENOSYS {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Mount(root, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the root layer over /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// enter drops to the harness's credentials and goes to its cwd.
func (p *Plan) enter() error {
	if p.SetCred {
		gs := make([]int, len(p.Groups))
		for i, g := range p.Groups {
			gs[i] = int(g)
		}
		if err := unix.Setgroups(gs); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := unix.Setresgid(int(p.GID), int(p.GID), int(p.GID)); err != nil {
			return fmt.Errorf("setgid: %w", err)
		}
		if err := unix.Setresuid(int(p.UID), int(p.UID), int(p.UID)); err != nil {
			return fmt.Errorf("setuid: %w", err)
		}
	}
	if p.Cwd != "" {
		if err := unix.Chdir(p.Cwd); err != nil {
			return fmt.Errorf("chdir %s: %w", p.Cwd, err)
		}
	}
	return nil
}

type mountEntry struct {
	id, parent string
	point      string
	fstype     string
}

func readMountinfo(path string) ([]mountEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 {
			continue
		}
		sep := -1
		for i := 6; i < len(fs); i++ {
			if fs[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fs) {
			continue
		}
		out = append(out, mountEntry{id: fs[0], parent: fs[1], point: unescapeMount(fs[4]), fstype: fs[sep+1]})
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// topLevel are the mounts right below the root mount, outermost first:
// each is bound with its submounts (MS_REC), so the sandbox's tree comes
// back as it was. A mount shadowed by a later one at the same point is
// left out (the later one is what the sandbox sees).
func topLevel(ms []mountEntry) []mountEntry {
	var rootID string
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].point == "/" {
			rootID = ms[i].id
			break
		}
	}
	seen := map[string]int{}
	var out []mountEntry
	for _, m := range ms {
		if m.parent != rootID || m.point == "/" {
			continue
		}
		if i, ok := seen[m.point]; ok {
			out[i] = m
			continue
		}
		seen[m.point] = len(out)
		out = append(out, m)
	}
	sort.SliceStable(out, func(i, j int) bool { return depth(out[i].point) < depth(out[j].point) })
	return out
}

func isTopLevel(m mountEntry, ms []mountEntry) bool {
	for _, t := range topLevel(ms) {
		if t.point == m.point {
			return true
		}
	}
	return false
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

// under reports whether p is one of dirs or below one.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		d = filepath.Clean(d)
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}
