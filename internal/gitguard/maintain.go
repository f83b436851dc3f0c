package gitguard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/shimdev/shim/api"
	"golang.org/x/sys/unix"
)

// Maintenance: shim turns git's own automatic maintenance off (gc.auto=0,
// maintenance.auto=false: a gc that a harness's git starts in the
// background is killed by the fence, and leaves gc.log.lock behind) and
// does its own instead, with the same hardened git as every other call,
// only when the caller guarantees that no generation is live (nothing of
// the worktree owner's can race it: after a fence, before the next start).
// Without it every fence leaves a pack or two and loose objects, and the
// snapshot step's cost grows with the number of generations that came
// before.

// MaintainOptions configure Maintain.
type MaintainOptions struct {
	// KeepSnapshots is how many refs/shim/abandoned/* are kept (the newest
	// ones); 0 keeps all. Refs are pruned in batches: only once more than
	// KeepSnapshots + Slack exist, down to KeepSnapshots, so that one full
	// repack drops the objects of the whole batch.
	KeepSnapshots int
	// Slack is the batch (see KeepSnapshots); 0 is KeepSnapshots/10, at
	// least 1.
	Slack int
	// Protect names generations whose snapshot is never pruned (a
	// generation whose fence is pending: its snapshot may be the only copy
	// of its edits).
	Protect func(generation uint64) bool
}

// Thresholds of the incremental repack: a geometric repack runs once the
// object store has this many packs or loose objects. A fence of a layer
// with a harness commit adds two packs (its loose objects', the
// snapshot's): at 8 a roll-up ran every third such fence, 80-100 ms of it
// in a container; git's own gc.autoPackLimit is 50.
const (
	maintainMaxPacks = 24
	maintainMaxLoose = 256
)

// MaintainReport says what one Maintain did.
type MaintainReport = api.MaintenanceReport

// maintainConfig are the -c settings of the repack: no bitmaps, islands
// or kept packs of the harness's making changing what is written.
var maintainConfig = []string{
	"repack.writeBitmaps=false",
	"repack.useDeltaIslands=false",
	"repack.packKeptObjects=false",
	"pack.writeBitmapHashCache=false",
	"gc.reflogExpire=never",
}

// Tidy removes what a killed git leaves that makes the next git fail: lock
// files (index.lock, HEAD.lock, config.lock, packed-refs.lock,
// gc.log.lock, refs/**/*.lock, the object store's), gc.pid, and temporary
// object and pack files. It leaves an operation in progress (a merge or
// rebase) as it is: without a fence, it may be a person's. Call it only
// when no generation is live; it runs no git.
func (g *Guard) Tidy(ctx context.Context) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(false); err != nil {
		return nil, err
	}
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "open git dir")
	}
	defer unix.Close(gfd)
	removed, err := g.removeLocks(gfd)
	if err != nil {
		return removed, errorf(CodeRestoreFailed, err, "remove leftovers of a killed git")
	}
	return removed, nil
}

// removeLocks removes the lock and temporary files of a killed git
// (Tidy's list).
func (g *Guard) removeLocks(gfd int) ([]string, error) {
	l := &leftovers{}
	names, err := readDirNames(gfd)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if strings.HasSuffix(n, ".lock") || n == "gc.pid" || strings.HasPrefix(n, ".shim-tmp-") || strings.HasPrefix(n, tmpIndexName) {
			if err := l.rm(gfd, n, n); err != nil {
				return l.removed, err
			}
		}
	}
	if err := l.refLocks(gfd); err != nil {
		return l.removed, err
	}
	err = g.objectLeftovers(gfd, l)
	return l.removed, err
}

// Maintain keeps the repository's cost flat: it removes a killed git's
// locks, prunes snapshot refs beyond o.KeepSnapshots (in batches; 0
// prunes none), and repacks: a full repack plus prune when refs were
// pruned (here or by an earlier PruneSnapshots: their objects go),
// otherwise a geometric one once the packs or loose objects pass a
// threshold. The caller guarantees that no generation is live, or, with
// o.KeepSnapshots 0, that none can name by a ref or a reflog what
// PruneSnapshots made unreachable (it pruned before the generation
// started). A failed git is reported in MaintainReport.Error and
// returned; nothing reachable is ever removed, so the worktree stays as
// the restore left it.
func (g *Guard) Maintain(ctx context.Context, o MaintainOptions) (*MaintainReport, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, err := g.beginMaintain(ctx, o)
	if err != nil {
		return nil, err
	}
	defer unix.Close(m.gfd)
	t := time.Now()
	m.step("tidy", m.tidy)
	m.step("prune", m.prune)
	m.step("repack", m.repack)
	m.rep.PacksAfter, m.rep.LooseAfter = countObjects(m.gfd)
	m.rep.DurationsMS["total"] = ms(time.Since(t))
	if m.err != nil {
		m.rep.Error = m.err.Error()
		return m.rep, errorf(CodeInternal, m.err, "maintain %s", g.name)
	}
	return m.rep, nil
}

// PruneSnapshots deletes the snapshot refs beyond o.KeepSnapshots (in
// batches, never a protected one), with the harness refs of their
// generations and the reflog entries no ref reaches any more, and leaves
// their objects to the next full repack (Maintain). It is the part of
// maintenance that must run while no generation is live: a generation
// started afterwards cannot name the pruned objects by any ref or reflog
// entry, so a repack beside it (a layered worktree's lower, maintained
// while the next generation runs on its own layer) cannot delete an
// object its commits were built on. It reads the ref files and runs no
// git unless a batch is due.
func (g *Guard) PruneSnapshots(ctx context.Context, o MaintainOptions) (*MaintainReport, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, err := g.beginMaintain(ctx, o)
	if err != nil {
		return nil, err
	}
	defer unix.Close(m.gfd)
	m.step("prune", m.prune)
	if m.err != nil {
		m.rep.Error = m.err.Error()
		return m.rep, errorf(CodeInternal, m.err, "prune snapshots of %s", g.name)
	}
	return m.rep, nil
}

// beginMaintain checks o and opens the git dir (g.mu held); the caller
// closes m.gfd.
func (g *Guard) beginMaintain(ctx context.Context, o MaintainOptions) (*maintainRun, error) {
	if o.KeepSnapshots < 0 || o.Slack < 0 {
		return nil, errorf(CodeBadRequest, nil, "keep and slack must be >= 0")
	}
	if err := g.open(true); err != nil {
		return nil, err
	}
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "open git dir")
	}
	return &maintainRun{g: g, ctx: ctx, gfd: gfd, o: o, rep: &MaintainReport{DurationsMS: map[string]float64{}}}, nil
}

// maintainRun is one Maintain or PruneSnapshots in progress.
type maintainRun struct {
	g   *Guard
	ctx context.Context
	gfd int
	o   MaintainOptions
	rep *MaintainReport
	err error
}

func (m *maintainRun) step(name string, fn func() error) {
	if m.err != nil {
		return
	}
	t := time.Now()
	m.err = fn()
	m.rep.DurationsMS[name] = ms(time.Since(t))
}

func (m *maintainRun) tidy() (err error) {
	m.rep.Cleaned, err = m.g.removeLocks(m.gfd)
	m.rep.PacksBefore, m.rep.LooseBefore = countObjects(m.gfd)
	return err
}

// prune deletes the oldest snapshot refs once more than keep + slack
// exist, never a protected one.
func (m *maintainRun) prune() error {
	keep := m.o.KeepSnapshots
	slack := m.o.Slack
	if slack == 0 {
		slack = max(keep/10, 1)
	}
	// Counted from the ref files first (no git): most fences prune
	// nothing, and for-each-ref was a process of every one of them.
	if n := len(snapshotRefGens(m.gfd)); keep == 0 || n <= keep+slack {
		m.rep.SnapshotsKept = n
		return nil
	}
	snaps, err := m.g.list(m.ctx)
	if err != nil {
		return err
	}
	m.rep.SnapshotsKept = len(snaps)
	if len(snaps) <= keep+slack {
		return nil
	}
	var in strings.Builder
	var removed, gone []string
	pruned := map[string]bool{}
	for _, s := range snaps[keep:] { // snaps is newest first
		if m.o.Protect != nil && m.o.Protect(s.Generation) {
			continue
		}
		fmt.Fprintf(&in, "delete %s %s\n", s.Ref, s.Commit)
		removed = append(removed, s.Ref)
		pruned[strconv.FormatUint(s.Generation, 10)] = true
	}
	if len(removed) == 0 {
		return nil
	}
	gone = append(gone, removed...)
	// The refs the scan restore saved of those generations' harnesses
	// (refs/shim/harness/<gen>/...) go with their snapshots.
	if out, err := m.g.git(m.ctx, gitOpts{}, "for-each-ref", "--format=%(refname)", HarnessRefPrefix); err == nil {
		for _, r := range strings.Fields(string(out)) {
			if gen, _, ok := strings.Cut(strings.TrimPrefix(r, HarnessRefPrefix), "/"); ok && pruned[gen] {
				fmt.Fprintf(&in, "delete %s\n", r)
				gone = append(gone, r)
			}
		}
	}
	// Out of the trusted ref namespace first, then out of the repository:
	// a trusted ref the next restore would put back must never point at
	// objects a repack deleted, and the git that deletes them may be
	// killed after it committed (the next fence cancels maintenance with
	// SIGKILL). Killed between the two, the refs stay, untrusted: the next
	// restore keeps their values under refs/shim/harness/ and their
	// objects stay reachable.
	if err := m.g.untrustRefs(gone); err != nil {
		return fmt.Errorf("forget pruned snapshot refs: %w", err)
	}
	if _, err := m.g.git(m.ctx, gitOpts{stdin: strings.NewReader(in.String())}, "update-ref", "--stdin"); err != nil {
		return fmt.Errorf("delete snapshot refs: %w", err)
	}
	m.g.markUnpruned(true)
	m.rep.SnapshotsPruned = removed
	m.rep.SnapshotsKept = len(snaps) - len(removed)
	// The harness's own commits of a pruned snapshot are still in the
	// branch's and HEAD's reflogs: entries no longer reachable from their
	// ref go now, with the refs, so that nothing keeps (or names to a
	// generation started after this) the pruned objects.
	if _, err := m.g.git(m.ctx, gitOpts{config: maintainConfig}, "reflog", "expire", "--expire-unreachable=now", "--all"); err != nil {
		return fmt.Errorf("expire reflogs: %w", err)
	}
	return nil
}

// markUnpruned records (g.mu held) whether the git dir has pruned
// snapshot refs whose objects await a full repack.
func (g *Guard) markUnpruned(v bool) {
	if g.unpruned == nil {
		g.unpruned = map[string]bool{}
	}
	if v {
		g.unpruned[g.gitDir] = true
	} else {
		delete(g.unpruned, g.gitDir)
	}
}

// repack packs the refs and objects: in full when snapshot refs were
// pruned (by this run or an earlier PruneSnapshots: what only they
// reached is deleted), else geometrically once there are enough packs or
// loose objects.
func (m *maintainRun) repack() error {
	g, rep := m.g, m.rep
	full := g.unpruned[g.gitDir]
	if !full && rep.PacksBefore < maintainMaxPacks && rep.LooseBefore < maintainMaxLoose {
		return nil
	}
	if _, err := g.git(m.ctx, gitOpts{}, "pack-refs", "--all", "--prune"); err != nil {
		return fmt.Errorf("pack refs: %w", err)
	}
	rep.RefsPacked = true
	o := gitOpts{config: maintainConfig, quiet: false}
	if !full {
		if _, err := g.git(m.ctx, o, "repack", "-d", "-l", "-q", "--geometric=2", "--no-write-bitmap-index"); err != nil {
			return fmt.Errorf("geometric repack: %w", err)
		}
		rep.Repack = "geometric"
		return nil
	}
	// What is known whole may lose a subtree from here on (a geometric
	// repack keeps every object of the packs it rolls up; this one does
	// not).
	g.forgetWhole()
	if _, err := g.git(m.ctx, o, "repack", "-a", "-d", "-l", "-q", "--no-write-bitmap-index"); err != nil {
		return fmt.Errorf("full repack: %w", err)
	}
	if _, err := g.git(m.ctx, o, "prune", "--expire=now"); err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	rep.Repack, rep.ObjectsPruned = "full", true
	g.markUnpruned(false)
	return nil
}

// countObjects counts the packs and loose objects of the object store
// (reading directories; nothing is followed).
func countObjects(gfd int) (packs, loose int) {
	ofd, err := openDirAt(gfd, "objects")
	if err != nil {
		return 0, 0
	}
	defer unix.Close(ofd)
	names, err := readDirNames(ofd)
	if err != nil {
		return 0, 0
	}
	for _, n := range names {
		switch {
		case n == "pack":
			if fd, err := openDirAt(ofd, n); err == nil {
				ps, _ := readDirNames(fd)
				unix.Close(fd)
				for _, p := range ps {
					if strings.HasPrefix(p, "pack-") && strings.HasSuffix(p, ".pack") {
						packs++
					}
				}
			}
		case len(n) == 2 && isHex(n):
			if fd, err := openDirAt(ofd, n); err == nil {
				objs, _ := readDirNames(fd)
				unix.Close(fd)
				for _, o := range objs {
					if len(o) >= 38 && isHex(o) {
						loose++
					}
				}
			}
		}
	}
	return packs, loose
}

// SnapshotGenerations lists the generations of the snapshot refs of the
// worktree registered in stateDir (a Config.StateDir), from the files of
// its git dir (loose refs and packed-refs), without running git: what shim
// init reads for the fencing token's floor. It returns the worktree too
// ("" when stateDir holds no registration). The git dir is the worktree
// owner's, so a caller must treat what it finds as a claim, not a record.
func SnapshotGenerations(stateDir string) (worktree string, gens []uint64) {
	g := &Guard{cfg: Config{StateDir: stateDir}}
	s, err := g.loadState()
	if err != nil || s == nil {
		return "", nil
	}
	gfd, err := openDir(s.GitDir)
	if err != nil {
		return s.Worktree, nil
	}
	defer unix.Close(gfd)
	return s.Worktree, snapshotRefGens(gfd)
}

// snapshotRefGens lists the generations of the snapshot refs of the git
// dir open at gfd, once each, from its loose refs and packed-refs.
func snapshotRefGens(gfd int) []uint64 {
	seen := map[uint64]bool{}
	var gens []uint64
	add := func(name string) {
		if v, err := strconv.ParseUint(name, 10, 64); err == nil && !seen[v] {
			seen[v] = true
			gens = append(gens, v)
		}
	}
	if fd, err := openPathAt(gfd, "refs/shim/abandoned"); err == nil {
		names, _ := readDirNames(fd)
		unix.Close(fd)
		for _, n := range names {
			add(n)
		}
	}
	if data, _, err := readFileAt(gfd, "packed-refs", 64<<20); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) == 2 && strings.HasPrefix(f[1], RefPrefix) {
				add(strings.TrimPrefix(f[1], RefPrefix))
			}
		}
	}
	return gens
}

// openPathAt opens the directory rel (slash-separated) below dirfd, one
// component at a time, never through a symlink.
func openPathAt(dirfd int, rel string) (int, error) {
	fd := dirfd
	for i, c := range strings.Split(rel, "/") {
		next, err := openDirAt(fd, c)
		if i > 0 {
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}
