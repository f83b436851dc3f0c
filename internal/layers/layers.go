// Package layers gives each generation its own copy-on-write view of the
// sandbox: a mount and IPC namespace whose root is an overlay (lower: the
// sandbox's filesystem as shim found it; upper: the generation's root
// layer), and an overlay on each worktree (lower: the checkout at the
// baseline, .git included; upper: the generation's worktree layer).
//
// A harness never writes a lower. Its layers are plain directories shim
// reads after the kill: the worktree layer becomes the snapshot commit,
// the root layer is kept for forensics (bounded) and listed in the fence
// report. The mounts live only in the generation's mount namespace, so
// they go away with its last process and nothing is left mounted if shim
// dies.
//
// The package has one job: lay the layers out on disk, mount them in the
// generation's namespace (Stub, run by shim re-executed as the harness's
// parent inside the new namespaces) and remove them when they are no
// longer kept. It runs no git.
package layers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// StubArg is the hidden first argument of the layer stub.
const StubArg = "__layers"

// Isolation modes as status reports them.
const (
	ModeLayers = "layers"
	ModeScan   = "scan"
)

// Config is what the supervisor decides about layers.
type Config struct {
	// Dir holds every generation's layers (durable: the worktree layers
	// hold abandoned edits until the fence has made them a commit).
	Dir string
	// RootSize bounds each generation's root layer (a tmpfs): what a
	// harness writes outside the worktree and the shared paths.
	RootSize int64
	// WorktreeSize, when set, bounds each generation's worktree layer:
	// it is then a tmpfs of its own of that size (memory, lost with the
	// sandbox) instead of a directory on Dir's filesystem (durable, and
	// bounded only by that filesystem).
	WorktreeSize int64
	// Persist are paths bound into every generation as they are (a
	// package cache): what a harness writes there is shared.
	Persist []string
	// Bind are paths shim itself needs inside (the runtime dir with the
	// credential socket).
	Bind []string
	// Keep is how many fenced generations' layers are kept for
	// forensics.
	Keep int
	// KeepBytes bounds what the kept layers take in all (0: no bound
	// beyond Keep): the oldest go first, whatever Keep allows.
	KeepBytes int64
	// MinFree is the room (bytes) the filesystem of Dir should have
	// available: while it has less, the fenced generations' saved layers
	// are pruned, oldest first, whatever Keep and KeepBytes allow (a
	// harness that filled the filesystem leaves its forensic copy no
	// claim on the next generation's room). Pinned layers are never.
	MinFree int64
	// LowerGroup is the group that may enter the locked lowers' views
	// (LockLower): shim's own gits, run as a worktree's owner, get it;
	// no harness may have it.
	LowerGroup uint32
}

// Plan is one generation's layout, handed to the stub as JSON in its
// Launch (or, for the start-up probe, in its arguments): paths only, no
// secret.
type Plan struct {
	Generation uint64          `json:"generation"`
	Root       *RootLayer      `json:"root,omitempty"`
	Worktrees  []WorktreeLayer `json:"worktrees,omitempty"`
	Bind       []string        `json:"bind,omitempty"`
	Hide       []string        `json:"hide,omitempty"` // mounts not bound in (the layers themselves)
	Cwd        string          `json:"cwd"`
	UID        uint32          `json:"uid"`
	GID        uint32          `json:"gid"`
	Groups     []uint32        `json:"groups,omitempty"`
	SetCred    bool            `json:"set_cred"`
	// Ready, when set, is the stub's unix stream socket (Command's), on
	// which it reports right before the exec: "M" with its mount namespace's fd once
	// everything is mounted (or nothing, then EOF, if it could not open
	// it), the reason when it could not mount.
	Ready int `json:"ready,omitempty"`
	// RootTmpfs, when set, is a tmpfs the stub mounts (in its own
	// namespace) to hold the root layer: the start-up probe's.
	RootTmpfs string `json:"root_tmpfs,omitempty"`
	// prepared: the stub mounted the root layer before its Launch
	// (Prepare); the Launch mounts the worktree layers and binds them in.
	prepared bool
}

// RootLayer is the generation's root overlay.
type RootLayer struct {
	Upper  string `json:"upper"`
	Work   string `json:"work"`
	Merged string `json:"merged"`
}

// WorktreeLayer is one worktree's overlay: mounted on Path, over itself.
type WorktreeLayer struct {
	Path  string `json:"path"`
	Upper string `json:"upper"`
	Work  string `json:"work"`
}

// Layers manages the layers of one shim.
type Layers struct {
	cfg      Config
	mu       sync.Mutex
	pruneMu  sync.Mutex
	lockFD   int  // the layers dir's lock, once taken
	prepared bool // the layers dir is laid out
	// locks are the worktrees whose lower is locked (LockLower), by
	// path; guarded by mu.
	locks map[string]lowerLock
}

// New returns the manager for cfg. It touches nothing yet.
func New(cfg Config) *Layers {
	if cfg.RootSize <= 0 {
		cfg.RootSize = 1 << 30
	}
	if cfg.Keep < 0 {
		cfg.Keep = 0
	}
	return &Layers{cfg: cfg, locks: map[string]lowerLock{}}
}

// Dir is where the layers live.
func (l *Layers) Dir() string { return l.cfg.Dir }

// Persist are the shared paths.
func (l *Layers) Persist() []string { return append([]string(nil), l.cfg.Persist...) }

// Keep is how many fenced generations' layers are kept.
func (l *Layers) Keep() int { return l.cfg.Keep }

// KeepBytes bounds what the kept layers take in all (0: none).
func (l *Layers) KeepBytes() int64 { return l.cfg.KeepBytes }

// RootSize is the bound of a generation's root layer.
func (l *Layers) RootSize() int64 { return l.cfg.RootSize }

// WorktreeSize is the bound of a generation's worktree layer (0: on
// Dir's filesystem, unbounded).
func (l *Layers) WorktreeSize() int64 { return l.cfg.WorktreeSize }

// rootDir holds every generation's root layer, each on a tmpfs of its own.
func (l *Layers) rootDir() string { return filepath.Join(l.cfg.Dir, "root") }

// Prepare takes the layers dir and lays it out, once.
func (l *Layers) Prepare() error {
	if err := l.lock(); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.prepared {
		return nil
	}
	if err := os.MkdirAll(l.rootDir(), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(l.cfg.Dir, "wt"), 0o700); err != nil {
		return err
	}
	l.prepared = true
	return nil
}

// Release unmounts the root layers' tmpfs mounts and lets the layers dir
// go (shim's exit, tests).
func (l *Layers) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if l.prepared {
		es, _ := os.ReadDir(l.rootDir())
		for _, e := range es {
			unmount(filepath.Join(l.rootDir(), e.Name()))
		}
	}
	l.prepared = false
	if l.lockFD > 0 {
		unix.Close(l.lockFD)
		l.lockFD = 0
	}
	return err
}

// WorktreeKey names a worktree's layers: stable, short, any path.
func WorktreeKey(path string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(path)))
	return hex.EncodeToString(sum[:8])
}

// WorktreeUpper is where generation gen's layer of worktree path is.
func (l *Layers) WorktreeUpper(path string, gen uint64) string {
	return filepath.Join(l.cfg.Dir, "wt", WorktreeKey(path), strconv.FormatUint(gen, 10), "upper")
}

// RootUpper is where generation gen's root layer is.
func (l *Layers) RootUpper(gen uint64) string {
	return filepath.Join(l.rootDir(), strconv.FormatUint(gen, 10), "upper")
}

// NewPlan lays out generation gen's layers: empty dirs for its root layer
// and a layer for each worktree. Layers left by an earlier attempt of the
// same generation are emptied first (nothing of it ran: the start failed).
func (l *Layers) NewPlan(gen uint64, worktrees []string) (*Plan, error) {
	if err := l.Prepare(); err != nil {
		return nil, err
	}
	p := &Plan{Generation: gen, Bind: append(append([]string{}, l.cfg.Bind...), l.cfg.Persist...),
		Hide: []string{l.cfg.Dir}}
	rd := filepath.Join(l.rootDir(), strconv.FormatUint(gen, 10))
	if err := mountLayer(rd, l.cfg.RootSize, "upper", "work", "merged"); err != nil {
		return nil, err
	}
	p.Root = &RootLayer{Upper: filepath.Join(rd, "upper"), Work: filepath.Join(rd, "work"), Merged: filepath.Join(rd, "merged")}
	if err := likeLower(p.Root.Upper, "/"); err != nil {
		return nil, err
	}
	for _, w := range worktrees {
		d := filepath.Dir(l.WorktreeUpper(w, gen))
		var err error
		if l.cfg.WorktreeSize > 0 {
			err = mountLayer(d, l.cfg.WorktreeSize, "upper", "work")
			if err == nil {
				// A page of the tmpfs kept for the snapshot's marker
				// (gitguard writes "snapshot" beside the upper): a
				// harness that fills its layer cannot keep its fence
				// from marking the layer saved. Blank lines are no
				// commit's name.
				err = os.WriteFile(filepath.Join(d, "snapshot"), bytes.Repeat([]byte{'\n'}, 4096), 0o600)
			}
		} else {
			err = fresh(d, "upper", "work")
		}
		if err != nil {
			return nil, err
		}
		if err := likeLower(filepath.Join(d, "upper"), w); err != nil {
			return nil, err
		}
		p.Worktrees = append(p.Worktrees, WorktreeLayer{Path: filepath.Clean(w), Upper: filepath.Join(d, "upper"), Work: filepath.Join(d, "work")})
	}
	return p, nil
}

// likeLower gives an upper's top directory the owner and mode of its
// lower: the merged view's top directory takes them from the upper.
func likeLower(upper, lower string) error {
	var st unix.Stat_t
	if err := unix.Stat(lower, &st); err != nil {
		return err
	}
	if err := kernel.lchown(upper, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return os.Chmod(upper, os.FileMode(st.Mode&0o777)|modeBits(st.Mode))
}

func modeBits(m uint32) os.FileMode {
	var out os.FileMode
	if m&unix.S_ISVTX != 0 {
		out |= os.ModeSticky
	}
	if m&unix.S_ISGID != 0 {
		out |= os.ModeSetgid
	}
	return out
}

func fresh(dir string, subs ...string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for _, s := range subs {
		if err := os.MkdirAll(filepath.Join(dir, s), 0o700); err != nil {
			return err
		}
	}
	// The upper's root is the merged view's root: its mode and owner are
	// the lower's (overlayfs copies them up on the first write), but the
	// directories shim made must not be reachable by anyone else.
	return os.Chmod(dir, 0o700)
}

// planCommand wraps a command (path and argv) in the layer stub with its
// plan in its arguments: shim's own binary re-executed, in new mount and
// IPC namespaces (Cloneflags the caller adds to its SysProcAttr). The
// stub runs as root and drops to the plan's credentials before the exec.
// The start-up probe's; a generation's stub is Command's.
func planCommand(shimPath string, p *Plan, path string, argv []string) (string, []string, error) {
	b, err := jsonPlan(p)
	if err != nil {
		return "", nil, err
	}
	return shimPath, append([]string{"shim", StubArg, b, path}, argv...), nil
}

// Cloneflags are the namespaces every layered generation gets.
const Cloneflags = syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC

// Remove deletes generation gen's layers (root and every worktree's).
func (l *Layers) Remove(gen uint64) error {
	g := strconv.FormatUint(gen, 10)
	rd := filepath.Join(l.rootDir(), g)
	unmount(rd)
	errs := []error{os.RemoveAll(rd)}
	keys, _ := os.ReadDir(filepath.Join(l.cfg.Dir, "wt"))
	for _, k := range keys {
		d := filepath.Join(l.cfg.Dir, "wt", k.Name(), g)
		unmount(d) // a bounded worktree layer's tmpfs
		errs = append(errs, os.RemoveAll(d))
	}
	return errors.Join(errs...)
}

// Usage is what the worktree layer whose upper is upper holds and may
// hold (its tmpfs's statfs), and whether it is full (less than a block
// free, or no inode); ok is false for a layer on Dir's filesystem, which
// has no bound of its own.
func (l *Layers) Usage(upper string) (used, limit int64, full, ok bool) {
	d := filepath.Dir(upper)
	var fs unix.Statfs_t
	if l.cfg.WorktreeSize <= 0 || !mounted(d) || unix.Statfs(d, &fs) != nil {
		return 0, 0, false, false
	}
	bs := int64(fs.Bsize)
	return int64(fs.Blocks-fs.Bfree) * bs, int64(fs.Blocks) * bs, fs.Bavail == 0 || fs.Ffree == 0, true
}

// Unusable says why the layers dir cannot take a new generation's layers
// any more (its filesystem read-only, failing, or, where worktree layers
// lie on it, full), "" when it can. It writes and removes one probe file.
func (l *Layers) Unusable() string {
	dir := l.cfg.Dir
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return fmt.Sprintf("the layers dir %s cannot be read: %v", dir, err)
	}
	if fs.Flags&unix.ST_RDONLY != 0 {
		return fmt.Sprintf("the filesystem of the layers dir %s is read-only (remounted so after an error?)", dir)
	}
	if l.cfg.WorktreeSize == 0 && (fs.Bavail == 0 || fs.Ffree == 0) {
		return fmt.Sprintf("the filesystem of the layers dir %s is full (%d blocks, %d inodes free to a harness)", dir, fs.Bavail, fs.Ffree)
	}
	probe := filepath.Join(dir, ".probe")
	f, err := os.OpenFile(probe, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err == nil {
		_, err = f.Write([]byte{'\n'})
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if rerr := os.Remove(probe); err == nil {
			err = rerr
		}
	}
	if err != nil {
		return fmt.Sprintf("the layers dir %s cannot be written: %v", dir, err)
	}
	return ""
}

// WorktreeLayers lists generation gen's worktree layers: the dir of each
// (upper, and the snapshot's marker beside it), by worktree key.
func (l *Layers) WorktreeLayers(gen uint64) map[string]string {
	out := map[string]string{}
	keys, _ := os.ReadDir(filepath.Join(l.cfg.Dir, "wt"))
	for _, k := range keys {
		d := filepath.Join(l.cfg.Dir, "wt", k.Name(), strconv.FormatUint(gen, 10))
		if st, err := os.Lstat(d); err == nil && st.IsDir() {
			out[k.Name()] = d
		}
	}
	return out
}

// maxPruneWalk bounds the entries one layer's size walk looks at.
const maxPruneWalk = 100000

// Probe tries what a layered start does, in a child that exits at once:
// new namespaces, the root overlay, the pivot. It returns why layers are
// not available ("" when they are). run starts the child and waits for it
// (the caller's reaper).
func (l *Layers) Probe(ctx context.Context, shimPath string, run func(*exec.Cmd) error) string {
	if err := l.lock(); err != nil {
		return err.Error()
	}
	const gen = 0 // never a generation's number
	// A worktree layer too: its upper is on the layers dir's filesystem,
	// which must hold one (a container's fuse-overlayfs root cannot). The
	// root layer's tmpfs is the probe's own, mounted in its namespace:
	// the probe leaves no mount behind, even in shim's.
	lower, root := filepath.Join(l.cfg.Dir, "probe"), filepath.Join(l.cfg.Dir, "probe-root")
	for _, d := range []string{lower, root} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err.Error()
		}
		defer os.RemoveAll(d)
	}
	p := &Plan{Generation: gen, Cwd: "/", Bind: l.cfg.Bind, Hide: []string{l.cfg.Dir}, RootTmpfs: root,
		Root: &RootLayer{Upper: filepath.Join(root, "upper"), Work: filepath.Join(root, "work"), Merged: filepath.Join(root, "merged")}}
	d := filepath.Dir(l.WorktreeUpper(lower, gen))
	// Remove(gen) first: the probe's worktree key is empty only then.
	defer func() { l.Remove(gen); os.Remove(filepath.Dir(d)) }()
	if err := fresh(d, "upper", "work"); err != nil {
		return err.Error()
	}
	p.Worktrees = []WorktreeLayer{{Path: lower, Upper: filepath.Join(d, "upper"), Work: filepath.Join(d, "work")}}
	path, args, err := planCommand(shimPath, p, "/proc/self/exe", []string{"shim", "__probe"})
	if err != nil {
		return err.Error()
	}
	var out strings.Builder
	cmd := exec.CommandContext(ctx, path)
	cmd.Args, cmd.Stderr = args, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: Cloneflags}
	if err := run(cmd); err != nil {
		if s := strings.TrimSpace(out.String()); s != "" {
			return s
		}
		return err.Error()
	}
	return ""
}

// lock takes the layers dir for this shim (an advisory lock held until
// shim exits): two shims on one layers dir would take each other's
// generations' layers.
func (l *Layers) lock() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lockFD > 0 {
		return nil
	}
	if err := os.MkdirAll(l.cfg.Dir, 0o700); err != nil {
		return err
	}
	fd, err := unix.Open(filepath.Join(l.cfg.Dir, "lock"), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		return fmt.Errorf("the layers dir %s is in use by another shim (give each its own --layers)", l.cfg.Dir)
	}
	l.lockFD = fd
	return nil
}
