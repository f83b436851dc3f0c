package gitguard

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shimdev/shim/internal/snapshot"
	"golang.org/x/sys/unix"
)

// Layer limits: what one abandoned generation's layer can make the fence
// read. A file over Config.MaxFileSize is listed in NotStored (path, type,
// size, the hash of its first MiB), never read in full; the harness's own
// objects are imported up to maxLayerObjects bytes in all.
//
// Whatever the checkout's size, git's output is read as it comes
// (recordWriter, at most maxRecord bytes of a record held) and the
// baseline's trees are kept for the history check only up to
// maxBaselineTrees (some 6 MiB, kept between fences; a checkout of more
// directories has git check the history).
const (
	maxRecord        = 64 << 10
	maxBaselineTrees = 1 << 16
	maxLayerObjects  = 1 << 30
	maxLooseObject   = 64 << 20 // a loose object's claimed or compressed size
	maxLayerParents  = 64
)

// GitDirInside reports whether the worktree's git dir is its own .git
// directory (so a worktree layer holds everything a harness writes to
// the repository). Valid after Register or a Restore.
func (g *Guard) GitDirInside() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(true); err != nil {
		return false
	}
	return g.gitDir == filepath.Join(g.wt, ".git")
}

// VerifyLower puts the trusted copies of the repository's metadata
// (config, config.worktree, hooks, info, objects/info/alternates, a valid
// HEAD) back where the checkout's differ, and returns what it put back,
// relative to the git dir. It is a layered worktree's lower check at every
// fence: the lower is read-only to everyone but shim, so nothing should
// ever differ; what does is reported.
func (g *Guard) VerifyLower(ctx context.Context) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(true); err != nil {
		return nil, err
	}
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "open %s", g.gitDir)
	}
	defer unix.Close(gfd)
	return g.restoreMetadata(gfd)
}

// SnapshotLayer makes the worktree layer upper of an abandoned generation
// (an overlay's upper directory, the lower being the worktree at baseline,
// .git included) the commit refs/shim/abandoned/<generation>: the
// baseline's tree with the layer's files, whiteouts as deletions, opaque
// directories replacing the baseline's, the harness's own commits (their
// objects verified on import) as parents. Nothing in the worktree is read
// or written but the repository's objects and the ref: the lower is at the
// baseline by construction. A layer whose snapshot exists already (a
// retried fence) is not imported again.
//
//shimlint:allow atpaths: the marker is in shim's layers dir, beside the upper
func (g *Guard) SnapshotLayer(ctx context.Context, generation uint64, baseline, upper string) (*Report, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	start := time.Now()
	rep := &Report{Worktree: g.name, BaselineRev: baseline, Isolation: "layers", MaxFileSize: g.maxFile, DurationsMS: map[string]float64{}}
	if err := validRev(baseline); err != nil {
		return rep, err
	}
	if err := g.open(true); err != nil {
		return rep, err
	}
	ref := RefPrefix + strconv.FormatUint(generation, 10)
	rep.SnapshotRef = ref
	res, err := g.resolveLayerBase(ctx, baseline, ref)
	if err != nil {
		return rep, err
	}
	rep.DurationsMS["lookup"] = ms(time.Since(start))
	base, baseTree := res[0].oid, res[1].oid
	rep.Baseline, rep.HeadBefore = base, base
	// The layer's own snapshot exists when an earlier attempt of this
	// fence made it (its marker, in shim's layer dir, names it). A ref of
	// that name that is not this layer's (a previous shim's generation of
	// the same number) is kept as a parent, never taken for this one.
	marker := filepath.Join(filepath.Dir(upper), "snapshot")
	mine, _ := os.ReadFile(marker)
	in := &layerImport{g: g, ctx: ctx, generation: generation, base: base, baseTree: baseTree, ref: ref, rep: rep}
	described := false // the import's answers described the layer
	switch {
	case res[2].typ == "commit" && strings.TrimSpace(string(mine)) == res[2].oid:
		rep.SnapshotCommit, rep.SnapshotReused = res[2].oid, true
	case res[2].typ == "commit":
		// Kept only whole: a previous fence may have stopped between its
		// import and the check of its heads' history (see below).
		if len(g.complete(ctx, []string{res[2].oid}, base)) == 1 {
			in.older = res[2].oid
		} else {
			in.replace = true // not a parent: the new snapshot does not contain it
		}
		fallthrough
	default:
		if described, err = in.layer(upper, marker); err != nil {
			return rep, err
		}
	}
	rep.DurationsMS["snapshot"] = ms(time.Since(start))
	if !described {
		if err := g.describeLayer(ctx, base, baseTree, rep); err != nil {
			return rep, errorf(CodeRestoreFailed, err, "layer snapshot: describe")
		}
	}
	rep.DurationsMS["total"] = ms(time.Since(start))
	return rep, nil
}

// resolveLayerBase resolves the baseline's commit and tree and the
// snapshot ref ref (the tree from what an earlier snapshot learned, when
// the ref is known not to exist: no git).
func (g *Guard) resolveLayerBase(ctx context.Context, baseline, ref string) ([]objInfo, error) {
	if tree := g.knownTree(baseline); tree != "" && g.noRef(ref) {
		return []objInfo{{oid: baseline, typ: "commit"}, {oid: tree, typ: "tree"}, {}}, nil
	}
	res, err := g.lookup(ctx, []string{baseline + "^{commit}", baseline + "^{tree}", ref})
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "layer snapshot: resolve the baseline")
	}
	if res[0].typ != "commit" {
		return nil, errorf(CodeRestoreFailed, nil, "layer snapshot: baseline %q is not a commit in %s", baseline, g.name)
	}
	g.learnTree(res[0].oid, res[1].oid)
	return res, nil
}

// layer imports the layer upper as the snapshot: the harness's objects,
// then the layer's tree and commit, the ref synced, the marker written
// and the ref trusted. It reports whether the import's answers described
// the layer.
func (in *layerImport) layer(upper, marker string) (bool, error) {
	g, rep := in.g, in.rep
	t := time.Now()
	ufd, err := openDir(upper)
	if err != nil {
		return false, errorf(CodeRestoreFailed, err, "layer snapshot: open the layer")
	}
	defer unix.Close(ufd)
	in.ufd = ufd
	heads, history, err := g.importLayerObjects(in.ctx, ufd, in.base, in.baseTree, rep)
	rep.DurationsMS["objects"] = ms(time.Since(t))
	t = time.Now()
	if err != nil {
		return false, err
	}
	if in.older == "" { // else a parent the layer's objects do not walk
		in.history = history
	}
	in.notStored = len(rep.NotStored)
	described, err := in.run(heads, in.replace)
	rep.DurationsMS["import"] = ms(time.Since(t))
	if err != nil {
		g.removeImportLeftovers()
		return false, errorf(CodeRestoreFailed, err, "layer snapshot: import")
	}
	// Durable before anything says it exists: the marker, the fence's
	// state.
	if err := g.syncRef(in.ref); err != nil {
		return false, errorf(CodeRestoreFailed, err, "layer snapshot: sync the snapshot ref")
	}
	// The marker only spares a retried fence the import: a harness that
	// filled the disk it lies on cannot make a snapshot whose ref holds
	// every path fail (a retry then takes the ref for an older snapshot
	// and makes it a parent: nothing lost).
	if err := writeMarker(marker, rep.SnapshotCommit); err != nil {
		rep.MarkerError = err.Error()
	}
	// shim wrote it: a scan restore after this one (a moved baseline, a
	// push check) must not take it for the harness's.
	if err := g.trustRefs(map[string]string{in.ref: rep.SnapshotCommit}); err != nil {
		return false, errorf(CodeRestoreFailed, err, "layer snapshot: record the snapshot ref")
	}
	return described, nil
}

// A layerImport is one layer snapshot's import: the layer's tree on the
// baseline's, with the harness's heads and the older snapshot as parents.
type layerImport struct {
	g                   *Guard
	ctx                 context.Context
	ufd                 int
	generation          uint64
	base, baseTree, ref string
	older               string // a previous snapshot of that ref, kept as a parent
	replace             bool   // the ref names a snapshot that is not kept (its history is not whole)
	// history: the heads' history as the layer's objects tell it (every
	// head whole), nil when git checks it (complete, countLocal).
	history   *layerHistory
	rep       *Report
	notStored int // rep.NotStored's entries from before the import (the objects')
}

// run imports the layer with heads as its parents and reports whether the
// import's answers described it. The check that each head's history is
// whole (complete) runs beside the first import: a head whose history is
// not whole (a hostile harness), or one fast-import refuses (a commit it
// cannot read: the harness's bytes must not fail the fence), is rare, and
// then the layer is imported again, over the first, with the whole heads,
// then with none. force: the ref names a snapshot that is not kept.
func (in *layerImport) run(heads []string, force bool) (bool, error) {
	if in.history != nil {
		described, _, err := in.once(heads, force, false)
		if err == nil || len(heads) == 0 {
			return described, err
		}
		// fast-import refused a head the layer's objects called whole:
		// git checks them, as without history
		in.g.removeImportLeftovers()
		in.history, force = nil, true
	}
	described, whole, err := in.once(heads, force, len(heads) > 0)
	if len(heads) == 0 || (err == nil && len(whole) == len(heads)) {
		return described, err
	}
	if err != nil {
		in.g.removeImportLeftovers()
	}
	if described, _, err = in.once(whole, true, false); err != nil && len(whole) > 0 {
		in.g.removeImportLeftovers()
		described, _, err = in.once(nil, true, false)
	}
	return described, err
}

// once is one import with heads as parents, with the count of the
// harness's commits beside it, and, with check, the heads whose history
// is whole. A failed count is an error only when every head is whole (it
// fails on a history that is not).
func (in *layerImport) once(heads []string, force, check bool) (described bool, whole []string, err error) {
	rep, base := in.rep, in.base
	parents := []string{base}
	for _, h := range heads {
		if h != base && len(parents) < maxLayerParents {
			parents = append(parents, h)
		}
	}
	rep.HeadBefore = base
	if len(parents) > 1 {
		parents = parents[1:] // the harness's head first, as the scan's snapshot has it
		rep.HeadBefore = parents[0]
	}
	if in.older != "" {
		parents = append(parents, in.older)
	}
	msg := snapshotMessage(in.generation, in.g.name, base, rep.HeadBefore)
	rep.NotStored, rep.Paths, rep.PathsTruncated = rep.NotStored[:in.notStored], nil, false
	rep.Modified, rep.Added, rep.Deleted, rep.LocalCommits = 0, 0, 0, 0
	var cerr error
	err = parallel(
		func() (err error) {
			rep.SnapshotCommit, described, err = in.g.importLayer(in.ctx, in.ufd, parents, in.baseTree, msg, in.ref, force, rep)
			return err
		},
		func() error {
			switch {
			case rep.HeadBefore == base:
			case in.history != nil:
				rep.LocalCommits = in.history.commits
			default:
				rep.LocalCommits, cerr = in.g.countLocal(in.ctx, parents, base)
			}
			return nil
		},
		func() error {
			if check {
				whole = in.g.complete(in.ctx, heads, base)
			}
			return nil
		})
	if err == nil && (!check || len(whole) == len(heads)) {
		err = cerr
	}
	return described, whole, err
}

// knownTree is the tree of commit rev (a full object name) an earlier
// snapshot resolved in this git dir, "" when none did.
func (g *Guard) knownTree(rev string) string {
	if !isHex(rev) || (len(rev) != 40 && len(rev) != 64) {
		return ""
	}
	return g.trees[g.gitDir][rev]
}

// treesOf is the set of baseline's trees (its root tree baseTree and
// every subtree), read with one `ls-tree -r -d` the first time a snapshot
// on that baseline needs it; nil when git cannot list them, or the
// baseline has more than maxBaselineTrees (then git checks the heads'
// history: complete).
func (g *Guard) treesOf(ctx context.Context, baseline, baseTree string) map[string]bool {
	if bt, ok := g.baseTrees[g.gitDir]; ok && bt.commit == baseline {
		return bt.trees
	}
	trees := map[string]bool{baseTree: true}
	out := &recordWriter{max: maxRecord, fn: func(rec []byte) error {
		// MODE SP TYPE SP NAME TAB PATH
		meta, _, _ := bytes.Cut(rec, []byte{'\t'})
		if f := strings.Fields(string(meta)); len(f) == 3 && f[1] == "tree" && isHex(f[2]) && len(f[2]) == len(baseTree) {
			trees[f[2]] = true
		}
		if len(trees) > maxBaselineTrees {
			return errors.New("too many trees")
		}
		return nil
	}}
	if _, err := g.git(ctx, gitOpts{index: filepath.Join(g.gitDir, "shim-no-index"), quiet: true, stdout: out},
		"ls-tree", "-r", "-d", "-z", "--full-tree", baseline); err != nil {
		return nil
	}
	if g.baseTrees == nil {
		g.baseTrees = map[string]baselineTrees{}
	}
	g.baseTrees[g.gitDir] = baselineTrees{commit: baseline, trees: trees}
	return trees
}

func (g *Guard) learnTree(commit, tree string) {
	if g.trees == nil {
		g.trees = map[string]map[string]string{}
	}
	m := g.trees[g.gitDir]
	if m == nil || len(m) > 64 {
		m = map[string]string{}
		g.trees[g.gitDir] = m
	}
	m[commit] = tree
}

// noRef reports whether ref is known not to exist: neither its loose file
// nor a line of packed-refs names it, in a repository whose refs are
// files (a reftable, or anything unexpected, is not known).
func (g *Guard) noRef(ref string) bool {
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return false
	}
	defer unix.Close(gfd)
	if _, err := lstatAt(gfd, "reftable"); !isNotExist(err) {
		return false
	}
	if st, err := lstatAt(gfd, "refs"); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return false
	}
	dir, name := filepath.Split(ref)
	if fd, err := openPathAt(gfd, strings.TrimSuffix(dir, "/")); err == nil {
		_, err := lstatAt(fd, name)
		unix.Close(fd)
		if !isNotExist(err) {
			return false // a file (or anything) there: git decides
		}
	} else if !isNotExist(err) {
		return false
	}
	b, _, err := readFileAt(gfd, "packed-refs", 64<<20)
	if isNotExist(err) {
		return true
	}
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == ref {
			return false
		}
	}
	return true
}

// removeImportLeftovers removes what a fast-import that failed (a full
// disk) leaves: its crash report and its temporary pack, which would only
// take more of the room it lacked.
//
//shimlint:allow atpaths: layers mode: the git dir is the locked lower, which no harness writes
func (g *Guard) removeImportLeftovers() {
	for _, pat := range []string{filepath.Join(g.gitDir, "fast_import_crash_*"), filepath.Join(g.gitDir, "objects", "pack", "tmp_pack_*")} {
		ms, _ := filepath.Glob(pat)
		for _, m := range ms {
			os.Remove(m)
		}
	}
}

// describeLayer fills the report's changes and local commits from the
// snapshot commit, both at once. Two trees need no index: diff-tree runs
// with one that does not exist (git would otherwise read the worktree's,
// 4 MiB at 50,000 files), named in the git dir, which git (run as the
// owner) can reach and no harness writes in layers mode.
//
//shimlint:allow atpaths: layers mode: the git dir is the locked lower; Remove unlinks, never follows
func (g *Guard) describeLayer(ctx context.Context, base, baseTree string, rep *Report) error {
	noIndex := filepath.Join(g.gitDir, "shim-no-index")
	if err := os.Remove(noIndex); err != nil && !os.IsNotExist(err) { // left by a harness in a scan-mode generation
		return err
	}
	return parallel(
		func() error {
			// read as it comes: a layer of a million changes is as many
			// records (counted, the first maxListed listed)
			var rec []byte
			out := &recordWriter{max: maxRecord, fn: func(b []byte) error {
				if rec == nil {
					rec = append(make([]byte, 0, len(b)), b...)
					return nil
				}
				fillChange(rec, string(b), &rep.Paths, &rep.PathsTruncated, &rep.Modified, &rep.Added, &rep.Deleted, &rep.NestedRepos)
				rec = nil
				return nil
			}}
			_, err := g.git(ctx, gitOpts{index: noIndex, stdout: out}, "diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-abbrev", baseTree, rep.SnapshotCommit)
			return err
		},
		func() (err error) {
			if rep.HeadBefore != base {
				rep.LocalCommits, err = g.countLocal(ctx, []string{rep.SnapshotCommit + "^@"}, base)
			}
			return err
		},
	)
}

// countLocal counts the commits reachable from heads and not from base:
// the harness's own.
func (g *Guard) countLocal(ctx context.Context, heads []string, base string) (int, error) {
	args := append(append([]string{"rev-list", "--count"}, heads...), "--not", base)
	out, err := g.git(ctx, gitOpts{index: filepath.Join(g.gitDir, "shim-no-index")}, args...)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(out)))
}

// importLayer imports the layer as the snapshot commit (on parents, the
// baseline first, with msg, on ref): shim's own import (importInShim) of
// the walk's typed changes (internal/snapshot), else git fast-import's of them (what shim's
// does not take, and force: over a first import whose parents were not
// all whole). It reports false when the changes found do not describe
// the layer alone (an opaque directory, a directory deleted or put where
// a file was, fast-import's), for describeLayer.
func (g *Guard) importLayer(ctx context.Context, ufd int, parents []string, baseTree, msg, ref string, force bool, rep *Report) (string, bool, error) {
	c := snapshot.Commit{Ref: ref, Msg: msg, BaseTree: baseTree, Parents: parents, Now: time.Now().Unix()}
	if !force {
		notStored := len(rep.NotStored)
		commit, described, err := g.importInShim(ctx, ufd, c, rep)
		if !errors.Is(err, errNotHere) {
			return commit, described, err
		}
		rep.NotStored = rep.NotStored[:notStored]
	}
	commit, err := g.importByGit(ctx, ufd, c, force, rep)
	return commit, false, err
}

// layerObjects is what importObjects brought in: the layer's checked loose
// objects by name (its pack type each), the ones of them the repository
// did not have, and whether the layer's own packs were read.
type layerObjects struct {
	types map[string]int
	fresh map[string]*looseObject
	packs bool
}

// writeMarker records that the layer's snapshot is commit (after its ref
// is durable): in place, so that a full disk can still take it where a
// page was kept for it (a bounded layer's tmpfs), then synced.
//
//shimlint:allow atpaths: the marker is in shim's layers dir beside the upper, opened O_NOFOLLOW
func writeMarker(path, commit string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	b := []byte(commit + "\n")
	if st, serr := f.Stat(); serr == nil && st.Size() > int64(len(b)) && st.Size() <= 1<<16 {
		// the rest of what was there (the kept page) becomes blank
		// lines, in place: no commit's name, no new block
		b = append(b, bytes.Repeat([]byte{'\n'}, int(st.Size())-len(b))...)
	}
	_, err = f.WriteAt(b, 0)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
