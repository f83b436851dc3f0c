package gitguard

import (
	"context"
	"errors"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Restore saves every abandoned edit of the worktree and resets it to the
// baseline, in this order:
//
//  1. metadata: remove what a killed git left (locks, merge/rebase/bisect
//     state, temporary object files) and put back the trusted copies of the
//     git metadata, so nothing the harness wrote there runs or redirects;
//  2. snapshot: resolve the baseline (only now, among the refs and objects
//     as they are once the metadata is pristine; see resolveBaseline), then
//     with a temporary index seeded from the trusted index, `add -A` (no
//     filter runs, blobs into one pack; the ignored files are listed
//     alongside), `diff-index --cached <baseline>` names every path that
//     differs, then one fast-import writes the trees and the commit, with
//     the abandoned HEAD (and the pristine branch, if it differs) as
//     parents, and creates refs/shim/abandoned/<generation>;
//  3. clean: nested repositories without a commit are moved into the git
//     dir; HEAD back on the pristine branch, the branch at the baseline and
//     refs/replace/* moved aside in one update-ref transaction; the ignored
//     paths and every path that differs from the baseline are removed
//     (never through a symlink, never a keep path);
//  4. reset: the temporary index, which after the add describes the
//     worktree, gets the baseline's entries for those paths
//     (`update-index --index-info`, run beside fast-import when there is no
//     earlier snapshot of the generation) and `checkout-index` writes them; it
//     becomes the index. Only what differs is touched, unlike `reset
//     --hard`, which walks every entry again;
//  5. verify: `diff-index HEAD` (index and every tracked file against the
//     baseline), `ls-files --others` (anything untracked, ignored or not)
//     and HEAD must show the baseline and nothing else; untracked
//     directories holding nothing but directories are removed here.
//
// baseline may be a commit id or a ref name not resolved yet: it is
// resolved in step 2, after the pristine metadata is back, and the commit
// is Report.Baseline (Report.BaselineRev is what was asked). A revision
// that does not resolve to a commit is RESTORE_FAILED naming it; the edits
// are then still saved under the ref, as the whole worktree's tree (there
// is no baseline to compare with), and nothing is reset.
//
// With WithFetch, the branch is fetched between the snapshot and the clean
// (see Fetch): the metadata is pristine by then, so the remote's URL comes
// from the trusted config, and every abandoned edit is already in a ref when
// the network is used. Its outcome is Report.Fetch; a failed fetch does not
// fail the restore.
//
// Every git has a deadline (Config.GitTimeout). Nothing is reset before the
// snapshot ref is written. A failure at any step is RESTORE_FAILED
// (BAD_REQUEST only for a malformed revision or fetch spec). Restore is
// idempotent: repeated after an interruption it reuses the generation's
// snapshot when it already holds everything (never replacing it with an
// emptier one) and otherwise records a new snapshot whose parents include
// the old one.
func (g *Guard) Restore(ctx context.Context, generation uint64, baseline string, opts ...RestoreOption) (*Report, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	r, err := g.newRestore(ctx, generation, baseline, opts)
	if err != nil {
		return nil, err
	}
	defer r.close()
	r.step("metadata", r.metadata)
	if r.g.refsKept {
		r.step("refs", r.refs)
	}
	r.step("snapshot", r.snapshot)
	if r.fetchSpec != nil {
		r.step("fetch", r.fetch)
	}
	r.step("clean", r.clean)
	r.step("reset", r.reset)
	r.step("verify", r.verify)
	return r.finish()
}

// restoreRun is one Restore in progress: what it works on, the report it
// fills and the first error, after which no further step runs.
type restoreRun struct {
	g          *Guard
	ctx        context.Context
	generation uint64
	rev        string // the baseline as asked
	ref        string // refs/shim/abandoned/<generation>
	fetchSpec  *FetchSpec
	gfd, wfd   int // the git dir and the worktree, open
	start      time.Time
	rep        *Report
	sn         *snap       // filled by the snapshot step
	heads      *refsResult // filled by the refs step
	repaired   bool        // the full repair ran
	err        error
}

// newRestore checks the arguments, opens the worktree and its git dir and
// returns the run; g.mu is held.
func (g *Guard) newRestore(ctx context.Context, generation uint64, baseline string, opts []RestoreOption) (*restoreRun, error) {
	start := time.Now()
	var o restoreOpts
	for _, f := range opts {
		f(&o)
	}
	if err := validRev(baseline); err != nil {
		return nil, err
	}
	if o.fetch != nil {
		if err := o.fetch.Validate(); err != nil {
			return nil, err
		}
	}
	if err := g.open(true); err != nil {
		return nil, err
	}
	gfd, err := openDir(g.gitDir)
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "open git dir")
	}
	wfd, err := openDir(g.wt)
	if err != nil {
		unix.Close(gfd)
		return nil, errorf(CodeWorktreeRefused, err, "open worktree")
	}
	ref := RefPrefix + strconv.FormatUint(generation, 10)
	g.moveOnly = o.moveOnly
	return &restoreRun{
		g: g, ctx: ctx, generation: generation, rev: baseline, ref: ref, fetchSpec: o.fetch,
		gfd: gfd, wfd: wfd, start: start,
		rep: &Report{Worktree: g.name, BaselineRev: baseline, SnapshotRef: ref, DurationsMS: map[string]float64{}, Paths: []PathChange{},
			MaxFileSize: g.maxFile},
	}, nil
}

// step runs one step unless an earlier one failed, and records its time.
func (r *restoreRun) step(name string, run func() error) {
	if r.err != nil {
		return
	}
	t := time.Now()
	r.err = run()
	r.rep.DurationsMS[name] = ms(time.Since(t))
}

// close removes the temporary index and closes the directories.
func (r *restoreRun) close() {
	_ = removeAllAt(r.gfd, tmpIndexName)
	_ = removeAllAt(r.gfd, tmpIndexName+".lock")
	unix.Close(r.wfd)
	unix.Close(r.gfd)
}

// metadata is step 1: what a killed git left goes, the trusted metadata
// comes back.
func (r *restoreRun) metadata() (err error) {
	g := r.g
	if r.rep.Cleaned, err = g.removeLeftovers(r.gfd); err != nil {
		return errorf(CodeRestoreFailed, err, "remove leftovers of a killed git")
	}
	if r.rep.MetadataRestored, err = g.restoreMetadata(r.gfd); err != nil {
		return errorf(CodeRestoreFailed, err, "restore git metadata")
	}
	fixed, err := g.repairGitDirs(r.gfd)
	r.rep.Repaired = append(r.rep.Repaired, fixed...)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "repair the git dir's permissions")
	}
	g.refsKept = refsSupported(r.gfd)
	if g.st.Includes {
		// The pristine config includes other files: read the filter names
		// again, with includes, now that the config itself is pristine.
		out, err := g.git(r.ctx, gitOpts{}, "config", "-z", "--includes", "--list")
		if err != nil {
			return errorf(CodeRestoreFailed, err, "read config")
		}
		names, _ := parseConfigList(out)
		g.filters = dedupe(append(append([]string{}, g.st.Filters...), names...))
	}
	return nil
}

// refs is step 1b: the trusted ref namespace comes back, the harness's
// refs are kept under refs/shim/harness/<gen>/ (see refspace.go).
func (r *restoreRun) refs() (err error) {
	if r.heads, err = r.g.restoreRefs(r.gfd, r.generation, r.rep); err != nil {
		return errorf(CodeRestoreFailed, err, "restore the ref namespace")
	}
	return nil
}

// snapshot is step 2: every abandoned edit into the generation's ref. When
// it fails before anything was saved (git could not list or read part of
// the worktree as the owner: a mode-000 directory, say), the whole
// worktree and git dir are repaired as the owner and it runs once more.
func (r *restoreRun) snapshot() (err error) {
	r.sn, err = r.g.snapshot(r.ctx, r.gfd, r.wfd, r.generation, r.rev, r.ref, r.heads, r.rep)
	if err == nil || r.rep.SnapshotCommit != "" || !r.retryable(err) {
		return err
	}
	if rerr := r.repairAll(); rerr != nil {
		return errors.Join(err, rerr)
	}
	r.rep.NotStored = nil
	r.sn, err = r.g.snapshot(r.ctx, r.gfd, r.wfd, r.generation, r.rev, r.ref, r.heads, r.rep)
	if errors.Is(err, errNeedRepair) {
		return errorf(CodeRestoreFailed, err, "snapshot: git still cannot read the worktree as its owner after the repair")
	}
	return err
}

// retryable: a failure a repair may cure (not a deadline: a git blocked
// on a FIFO would only block again, nor the caller's cancel).
func (r *restoreRun) retryable(err error) bool {
	return !r.repaired && r.ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded)
}

// repairAll runs the full repair once per restore.
func (r *restoreRun) repairAll() error {
	r.repaired = true
	t := time.Now()
	fixed, err := r.g.repairAll()
	r.rep.Repaired = append(r.rep.Repaired, fixed...)
	r.rep.DurationsMS["repair"] = ms(time.Since(t))
	if err != nil {
		return errorf(CodeRestoreFailed, err, "repair the worktree's permissions")
	}
	return nil
}

// fetch is step 2b: reported in Report.Fetch, never a failure.
func (r *restoreRun) fetch() error {
	r.rep.Fetch = r.g.fetch(r.ctx, r.sn.baseline, *r.fetchSpec)
	return nil
}

// clean is step 3. Nested repositories git could not record are moved into
// the git dir first, so their files are kept.
func (r *restoreRun) clean() (err error) {
	g, sn, rep := r.g, r.sn, r.rep
	if len(sn.nested) > 0 {
		if rep.NestedReposMovedTo, err = g.moveNested(r.gfd, r.generation, sn.nested); err != nil {
			return errorf(CodeRestoreFailed, err, "move nested repositories aside")
		}
		rep.NestedRepos = append(rep.NestedRepos, sn.nested...)
	}
	if err := g.prepareHead(r.gfd, sn.baseline); err != nil {
		return errorf(CodeRestoreFailed, err, "point HEAD at the pristine branch")
	}
	// The refs, the report's description and the removals are independent.
	// Removing the ignored and changed paths before anything is checked out
	// means no .gitattributes the harness left can apply to the checkout.
	err = parallel(
		func() error { return g.updateRefs(r.ctx, r.generation, sn, rep) },
		func() error { return g.describe(r.ctx, sn, rep) },
		func() error { return g.removeChanged(r.wfd, sn) },
	)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "clean")
	}
	return nil
}

// reset is step 4. The directories checkout-index writes into are made
// writable for the owner first; a checkout that fails all the same gets
// the full repair and a second try.
func (r *restoreRun) reset() error {
	var paths []string
	for _, e := range parseRaw(r.sn.diff) {
		if e.status != 'A' {
			paths = append(paths, e.path)
		}
	}
	fixed, err := r.g.repairParents(r.wfd, paths)
	r.rep.Repaired = append(r.rep.Repaired, fixed...)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "repair the directories of the reset")
	}
	err = r.g.checkoutBaseline(r.ctx, r.gfd, r.sn)
	if err != nil && r.retryable(err) {
		if rerr := r.repairAll(); rerr != nil {
			return errors.Join(errorf(CodeRestoreFailed, err, "reset to %s", r.sn.baseline), rerr)
		}
		err = r.g.checkoutBaseline(r.ctx, r.gfd, r.sn)
	}
	if err != nil {
		return errorf(CodeRestoreFailed, err, "reset to %s", r.sn.baseline)
	}
	return nil
}

// verify is step 5.
func (r *restoreRun) verify() error { return r.g.verify(r.ctx, r.wfd, r.sn.baseline) }

// finish makes the index git just wrote the trusted stat record for next
// time and prunes old snapshots, after a successful restore.
func (r *restoreRun) finish() (*Report, error) {
	if r.err != nil {
		return r.rep, r.err
	}
	if err := r.g.saveTrustedIndex(r.gfd); err != nil {
		return r.rep, errorf(CodeRestoreFailed, err, "save trusted index")
	}
	if n := r.g.cfg.KeepSnapshots; n > 0 {
		if _, err := r.g.prune(r.ctx, n); err != nil {
			return r.rep, errorf(CodeRestoreFailed, err, "prune snapshots")
		}
	}
	if err := r.g.saveRefsAsTrusted(r.gfd); err != nil {
		return r.rep, errorf(CodeRestoreFailed, err, "save the trusted refs")
	}
	r.rep.DurationsMS["total"] = ms(time.Since(r.start))
	return r.rep, nil
}

// saveTrustedIndex copies the index git wrote (keeping its mtime, which
// git's racy-entry check compares against) into StateDir.
func (g *Guard) saveTrustedIndex(gfd int) error {
	data, st, err := readFileAt(gfd, "index", 1<<31)
	if err != nil {
		return err
	}
	mt := st.Mtim
	if err := writeFileAtomic(g.stateFile(trustedIndex), data, &mt); err != nil {
		return err
	}
	if !g.st.HasIndex {
		g.st.HasIndex = true
		return g.saveState(g.st)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
