package gitguard

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Restore saves every abandoned edit of the worktree and resets it to the
// baseline, in this order:
//
//  1. metadata: remove what a killed git left (locks, merge/rebase/bisect
//     state, temporary object files) and put back the trusted copies of the
//     git metadata, so nothing the harness wrote there runs or redirects;
//  2. snapshot: with a temporary index seeded from the trusted index, `add
//     -A` (no filter runs, blobs into one pack; the ignored files are
//     listed alongside), `diff-index --cached <baseline>` names every path
//     that differs, then one fast-import writes the trees and the commit,
//     with the abandoned HEAD (and the pristine branch, if it differs) as
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
// With WithFetch, the branch is fetched between the snapshot and the clean
// (see Fetch): the metadata is pristine by then, so the remote's URL comes
// from the trusted config, and every abandoned edit is already in a ref when
// the network is used. Its outcome is Report.Fetch; a failed fetch does not
// fail the restore.
//
// Nothing is reset before the snapshot ref is written. A failure at any
// step is RESTORE_FAILED (BAD_REQUEST for a baseline that is not a commit).
// Restore is idempotent: repeated after an interruption it reuses the
// generation's snapshot when it already holds everything (never replacing
// it with an emptier one) and otherwise records a new snapshot whose parents
// include the old one.
func (g *Guard) Restore(ctx context.Context, generation uint64, baseline string, opts ...RestoreOption) (*Report, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
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
	ref := RefPrefix + strconv.FormatUint(generation, 10)
	rep := &Report{Worktree: g.wt, SnapshotRef: ref, DurationsMS: map[string]float64{}, Paths: []PathChange{}}
	step := func(name string, t time.Time) { rep.DurationsMS[name] = ms(time.Since(t)) }

	gfd, err := openDir(g.gitDir)
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "open git dir")
	}
	defer unix.Close(gfd)
	wfd, err := openDir(g.wt)
	if err != nil {
		return nil, errorf(CodeWorktreeRefused, err, "open worktree")
	}
	defer unix.Close(wfd)

	// 1. metadata
	t := time.Now()
	if rep.Cleaned, err = g.removeLeftovers(gfd); err != nil {
		return rep, errorf(CodeRestoreFailed, err, "remove leftovers of a killed git")
	}
	if rep.MetadataRestored, err = g.restoreMetadata(gfd); err != nil {
		return rep, errorf(CodeRestoreFailed, err, "restore git metadata")
	}
	if g.st.Includes {
		// The pristine config includes other files: read the filter names
		// again, with includes, now that the config itself is pristine.
		out, err := g.git(ctx, gitOpts{}, "config", "-z", "--includes", "--list")
		if err != nil {
			return rep, errorf(CodeRestoreFailed, err, "read config")
		}
		names, _ := parseConfigList(out)
		g.filters = dedupe(append(append([]string{}, g.st.Filters...), names...))
	}
	step("metadata", t)

	// 2. snapshot
	t = time.Now()
	defer func() {
		_ = removeAllAt(gfd, tmpIndexName)
		_ = removeAllAt(gfd, tmpIndexName+".lock")
	}()
	sn, err := g.snapshot(ctx, gfd, generation, baseline, ref, rep)
	step("snapshot", t)
	if err != nil {
		return rep, err
	}

	// 2b. fetch: reported, never a failure of the restore.
	if o.fetch != nil {
		t = time.Now()
		rep.Fetch = g.fetch(ctx, sn.baseline, *o.fetch)
		step("fetch", t)
	}

	// 3. clean. Nested repositories git could not record are moved into the
	// git dir first, so their files are kept.
	t = time.Now()
	if len(sn.nested) > 0 {
		if rep.NestedReposMovedTo, err = g.moveNested(gfd, generation, sn.nested); err != nil {
			return rep, errorf(CodeRestoreFailed, err, "move nested repositories aside")
		}
		rep.NestedRepos = append(rep.NestedRepos, sn.nested...)
	}
	if err := g.prepareHead(gfd, sn.baseline); err != nil {
		return rep, errorf(CodeRestoreFailed, err, "point HEAD at the pristine branch")
	}
	// The refs, the report's description and the removals are independent.
	// Removing the ignored and changed paths before anything is checked out
	// means no .gitattributes the harness left can apply to the checkout.
	err = parallel(
		func() error { return g.updateRefs(ctx, generation, sn, rep) },
		func() error { return g.describe(ctx, sn, rep) },
		func() error { return g.removeChanged(wfd, sn) },
	)
	step("clean", t)
	if err != nil {
		return rep, errorf(CodeRestoreFailed, err, "clean")
	}

	// 4. reset
	t = time.Now()
	err = g.checkoutBaseline(ctx, gfd, sn)
	step("reset", t)
	if err != nil {
		return rep, errorf(CodeRestoreFailed, err, "reset to %s", sn.baseline)
	}

	// 5. verify
	t = time.Now()
	err = g.verify(ctx, wfd, sn.baseline)
	step("verify", t)
	if err != nil {
		return rep, err
	}

	// The index git just wrote is the trusted stat record for next time.
	if err := g.saveTrustedIndex(gfd); err != nil {
		return rep, errorf(CodeRestoreFailed, err, "save trusted index")
	}
	if g.cfg.KeepSnapshots > 0 {
		if _, err := g.prune(ctx, g.cfg.KeepSnapshots); err != nil {
			return rep, errorf(CodeRestoreFailed, err, "prune snapshots")
		}
	}
	rep.DurationsMS["total"] = ms(time.Since(start))
	return rep, nil
}

// snap carries what the snapshot step learned to the later steps.
type snap struct {
	baseline, baselineTree string
	commit                 string
	parents                []string    // abandoned heads (not the old snapshot)
	ignored                []byte      // ls-files output
	replaceRefs            [][2]string // refs/replace/* found: name, object
	nested                 []string    // nested repositories without a commit, left out
	diff                   []byte      // diff-index --cached -z --raw <baseline> of the temporary index
	reused                 bool        // the generation's existing snapshot was kept
	staged                 bool        // the temporary index has the baseline's entries (stageBaseline)
}

func (g *Guard) snapshot(ctx context.Context, gfd int, generation uint64, baseline, ref string, rep *Report) (*snap, error) {
	// One cat-file answers every lookup.
	pristineBranch, _ := strings.CutPrefix(strings.TrimSpace(g.st.Head), "ref: ")
	if pristineBranch == strings.TrimSpace(g.st.Head) {
		pristineBranch = ""
	}
	queries := []string{baseline + "^{commit}", baseline + "^{tree}", "HEAD", ref, ref + "^{tree}"}
	if pristineBranch != "" {
		queries = append(queries, pristineBranch)
	}
	res, err := g.lookup(ctx, queries)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "look up baseline and HEAD")
	}
	s := &snap{baseline: res[0].oid, baselineTree: res[1].oid}
	if res[0].typ != "commit" {
		return nil, errorf(CodeBadRequest, nil, "baseline %q is not a commit in %s", baseline, g.wt)
	}
	rep.Baseline = s.baseline
	if res[2].typ == "commit" {
		rep.HeadBefore = res[2].oid
		s.parents = append(s.parents, res[2].oid)
	}
	if pristineBranch != "" && res[5].typ == "commit" && res[5].oid != rep.HeadBefore {
		s.parents = append(s.parents, res[5].oid)
	}
	if len(s.parents) == 0 {
		s.parents = []string{s.baseline}
	}
	existing, existingTree := "", ""
	if res[3].typ == "commit" {
		existing, existingTree = res[3].oid, res[4].oid
	} else if res[3].typ != "" {
		return nil, errorf(CodeRestoreFailed, nil, "%s exists but is a %s, not a commit", ref, res[3].typ)
	}

	// Temporary index seeded from the trusted one: only files whose stat
	// data changed since git last recorded them are read again.
	if g.st.HasIndex {
		data, err := os.ReadFile(filepath.Join(g.cfg.StateDir, trustedIndex))
		if err != nil {
			return nil, errorf(CodeRestoreFailed, err, "read trusted index")
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(g.cfg.StateDir, trustedIndex), &st); err != nil {
			return nil, errorf(CodeRestoreFailed, err, "stat trusted index")
		}
		mt := st.Mtim
		if err := writeFileAt(gfd, tmpIndexName, data, 0o600, g.uid, g.gid, &mt); err != nil {
			return nil, errorf(CodeRestoreFailed, err, "seed temporary index")
		}
	} else if err := removeAllAt(gfd, tmpIndexName); err != nil {
		return nil, errorf(CodeRestoreFailed, err, "clear temporary index")
	}
	// Keep paths stay out of the snapshot. Without --force they are
	// excluded as ignore patterns (an exclude pathspec that matches an
	// ignored path makes `git add` fail); with --force, by pathspec.
	addArgs := []string{"add", "-A"}
	// Every blob above core.bigFileThreshold is streamed into one pack
	// (bulk check-in) instead of a loose file each.
	keepCfg := []string{"core.bigFileThreshold=1"}
	if g.cfg.IncludeIgnored {
		addArgs = append(append(addArgs, "--force", "--", "."), g.excludePathspecs()...)
	} else if len(g.keep) > 0 {
		var pat strings.Builder
		for _, k := range g.keep {
			pat.WriteString("/" + escapeGlob(k) + "\n")
		}
		if err := writeFileAt(gfd, keepExcludeName, []byte(pat.String()), 0o644, g.uid, g.gid, nil); err != nil {
			return nil, errorf(CodeRestoreFailed, err, "write keep patterns")
		}
		defer removeAllAt(gfd, keepExcludeName)
		keepCfg = append(keepCfg, "core.excludesFile="+filepath.Join(g.gitDir, keepExcludeName))
	}
	fns := []func() error{func() error {
		_, err := g.git(ctx, gitOpts{index: g.tmpIndex, config: keepCfg}, addArgs...)
		if err == nil {
			return nil
		}
		// A nested repository without a commit makes add fail: leave
		// those out (they are moved aside after the snapshot) and retry.
		nested, nerr := g.nestedWithoutCommit(ctx, keepCfg)
		if nerr != nil || len(nested) == 0 {
			return err
		}
		s.nested = nested
		retry := addArgs
		if !g.cfg.IncludeIgnored {
			retry = append(append([]string{}, addArgs...), "--", ".")
		}
		for _, p := range nested {
			retry = append(retry, ":(exclude,literal)"+p)
		}
		if _, err2 := g.git(ctx, gitOpts{index: g.tmpIndex, config: keepCfg}, retry...); err2 != nil {
			return fmt.Errorf("%w; again without the nested repositories %s: %v", err, strings.Join(nested, ", "), err2)
		}
		return nil
	}}
	if !g.cfg.IncludeIgnored {
		lsArgs := []string{"ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"}
		fns = append(fns, func() error {
			out, err := g.git(ctx, gitOpts{index: g.tmpIndex}, lsArgs...)
			s.ignored = out
			return err
		})
	}
	fns = append(fns, func() (err error) {
		s.replaceRefs, err = g.listReplaceRefs(ctx)
		return err
	})
	if err = parallel(fns...); err != nil {
		return nil, errorf(CodeRestoreFailed, err, "snapshot: add")
	}
	// Every path where the worktree differs from the baseline: what the
	// snapshot adds to the baseline's tree, what the reset rewrites and
	// what the report lists.
	s.diff, err = g.git(ctx, gitOpts{index: g.tmpIndex}, "diff-index", "--cached", "-z", "--raw", "--no-renames", "--no-abbrev", s.baseline)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "snapshot: diff-index")
	}
	msg := fmt.Sprintf("shim: abandoned edits of generation %d\n\nSaved by shim before resetting %s to %s.\n\nShim-Generation: %d\nShim-Baseline: %s\nShim-Head: %s\n",
		generation, g.wt, s.baseline, generation, s.baseline, orNone(rep.HeadBefore))
	if existing == "" {
		// The common case: trees and commit go into one pack through
		// fast-import, which also creates the ref.
		// The temporary index gets the baseline's entries (for the reset)
		// while fast-import runs: fast-import reads only the diff, and the
		// worktree and the real index stay as they are until the ref exists.
		err = parallel(
			func() (err error) {
				if s.commit, err = g.fastImport(ctx, s.parents, s.baselineTree, s.diff, msg, ref); err != nil {
					return errorf(CodeRestoreFailed, err, "snapshot: fast-import")
				}
				return nil
			},
			func() error {
				if err := g.stageBaseline(ctx, s); err != nil {
					return errorf(CodeRestoreFailed, err, "snapshot: stage the baseline in the temporary index")
				}
				return nil
			},
		)
		// fast-import ran to its end either way: a snapshot it wrote is
		// reported even when the staging failed.
		rep.SnapshotCommit = s.commit
		if err != nil {
			return nil, err
		}
		return s, nil
	}
	treeOut, err := g.git(ctx, gitOpts{index: g.tmpIndex}, "write-tree")
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "snapshot: write-tree")
	}
	tree := strings.TrimSpace(string(treeOut))
	reuse, err := g.coveredBy(ctx, existing, existingTree, tree, s)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "compare with the existing snapshot %s", existing)
	}
	if reuse {
		s.commit = existing
		rep.SnapshotCommit = existing
		rep.SnapshotReused = true
		s.reused = true
		return s, nil
	}
	// Different content under the same generation: keep the old snapshot
	// reachable as an extra parent.
	parents := append(append([]string{}, s.parents...), existing)
	ctArgs := []string{"commit-tree", "--no-gpg-sign", tree}
	for _, p := range parents {
		ctArgs = append(ctArgs, "-p", p)
	}
	ctArgs = append(ctArgs, "-F", "-")
	out, err := g.git(ctx, gitOpts{stdin: strings.NewReader(msg), env: shimIdent}, ctArgs...)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "snapshot: commit-tree")
	}
	s.commit = strings.TrimSpace(string(out))
	if _, err := g.git(ctx, gitOpts{}, "update-ref", "-m", fmt.Sprintf("shim: save generation %d", generation), ref, s.commit, existing); err != nil {
		return nil, errorf(CodeRestoreFailed, err, "snapshot: update-ref %s", ref)
	}
	rep.SnapshotCommit = s.commit
	return s, nil
}

// fastImport creates the snapshot commit (and the new ref) from the
// temporary index: the baseline's tree plus diff (the temporary index
// against the baseline), so fast-import writes the trees and the commit
// into one pack. Loose objects cost a file each (most of a naive snapshot's
// time on a slow disk).
func (g *Guard) fastImport(ctx context.Context, parents []string, baselineTree string, diff []byte, msg, ref string) (string, error) {
	var in bytes.Buffer
	fmt.Fprintf(&in, "commit %s\nmark :1\ncommitter shim <shim@localhost> %d +0000\ndata %d\n%s\nfrom %s\n",
		ref, time.Now().Unix(), len(msg), msg, parents[0])
	for _, p := range parents[1:] {
		fmt.Fprintf(&in, "merge %s\n", p)
	}
	// The root tree is the baseline's, whatever the first parent's is.
	fmt.Fprintf(&in, "M 040000 %s \"\"\n", baselineTree)
	for _, e := range parseRaw(diff) {
		if e.status == 'D' {
			fmt.Fprintf(&in, "D %s\n", quotePath(e.path))
		} else {
			fmt.Fprintf(&in, "M %s %s %s\n", e.dstMode, e.dstOID, quotePath(e.path))
		}
	}
	in.WriteString("\nget-mark :1\ndone\n")
	out, err := g.git(ctx, gitOpts{stdin: &in, config: []string{"fastimport.unpackLimit=0"}},
		"fast-import", "--quiet", "--done", "--date-format=raw")
	if err != nil {
		return "", err
	}
	commit := strings.TrimSpace(string(out))
	if !isHex(commit) {
		return "", fmt.Errorf("fast-import answered %q", commit)
	}
	return commit, nil
}

// rawEntry is one record of `diff-index -z --raw --no-abbrev`: the source
// (the baseline) and destination (the worktree's index) sides.
type rawEntry struct {
	srcMode, dstMode, srcOID, dstOID string
	status                           byte
	path                             string
}

func parseRaw(out []byte) []rawEntry {
	var es []rawEntry
	f := bytes.Split(out, []byte{0})
	for i := 0; i+1 < len(f); i += 2 {
		meta := strings.Fields(strings.TrimPrefix(string(f[i]), ":"))
		if len(meta) < 5 || meta[4] == "" {
			continue
		}
		es = append(es, rawEntry{srcMode: meta[0], dstMode: meta[1], srcOID: meta[2], dstOID: meta[3],
			status: meta[4][0], path: string(f[i+1])})
	}
	return es
}

// quotePath quotes a path for fast-import (C style), so any byte is safe.
func quotePath(p string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// shimIdent is the author and committer of snapshot commits.
var shimIdent = []string{
	"GIT_AUTHOR_NAME=shim", "GIT_AUTHOR_EMAIL=shim@localhost",
	"GIT_COMMITTER_NAME=shim", "GIT_COMMITTER_EMAIL=shim@localhost",
}

// coveredBy decides whether the generation's existing snapshot already
// holds everything the worktree holds now (an interrupted or repeated
// Restore): every path that differs from the baseline must be as in the
// existing snapshot, and every abandoned head must be one of its parents
// (or the baseline).
func (g *Guard) coveredBy(ctx context.Context, existing, existingTree, tree string, s *snap) (bool, error) {
	out, err := g.git(ctx, gitOpts{}, "cat-file", "commit", existing)
	if err != nil {
		return false, err
	}
	have := map[string]bool{s.baseline: true}
	for _, line := range strings.Split(string(out), "\n") {
		if line == "" {
			break
		}
		if p, ok := strings.CutPrefix(line, "parent "); ok {
			have[p] = true
		}
	}
	for _, p := range s.parents {
		if !have[p] {
			return false, nil
		}
	}
	if tree == existingTree {
		return true, nil
	}
	var changed, differ []byte
	err = parallel(
		func() (err error) {
			changed, err = g.git(ctx, gitOpts{}, "diff-tree", "-r", "-z", "--name-only", "--no-renames", s.baselineTree, tree)
			return err
		},
		func() (err error) {
			differ, err = g.git(ctx, gitOpts{}, "diff-tree", "-r", "-z", "--name-only", "--no-renames", existingTree, tree)
			return err
		},
	)
	if err != nil {
		return false, err
	}
	d := map[string]bool{}
	for _, p := range bytes.Split(differ, []byte{0}) {
		if len(p) > 0 {
			d[string(p)] = true
		}
	}
	for _, p := range bytes.Split(changed, []byte{0}) {
		if len(p) > 0 && d[string(p)] {
			return false, nil
		}
	}
	return true, nil
}

// prepareHead points HEAD back at the pristine branch (so every generation
// starts on the same branch, which updateRefs then moves to the baseline),
// or at the baseline when the pristine HEAD was detached.
func (g *Guard) prepareHead(gfd int, baseline string) error {
	head := g.st.Head
	if !strings.HasPrefix(head, "ref: ") {
		head = baseline + "\n"
	}
	if cur, _, err := readFileAt(gfd, "HEAD", 4096); err != nil || string(cur) != head {
		return writeFileAt(gfd, "HEAD", []byte(head), 0o644, g.uid, g.gid, nil)
	}
	return nil
}

// pristineBranch is the branch the pristine HEAD names, or "".
func (g *Guard) pristineBranch() string {
	b, ok := strings.CutPrefix(strings.TrimSpace(g.st.Head), "ref: ")
	if !ok {
		return ""
	}
	return b
}

// updateRefs moves the pristine branch to the baseline and the replace
// refs the harness left aside, in one update-ref transaction. The branch is
// written as a plain ref (no-deref): a harness that made it a symref cannot
// redirect the update to another ref.
func (g *Guard) updateRefs(ctx context.Context, generation uint64, s *snap, rep *Report) error {
	var in strings.Builder
	if b := g.pristineBranch(); b != "" {
		fmt.Fprintf(&in, "option no-deref\nupdate %s %s\n", b, s.baseline)
	}
	in.WriteString(replaceRefCommands(generation, s.replaceRefs))
	if in.Len() == 0 {
		return nil
	}
	msg := fmt.Sprintf("shim: reset to the baseline (generation %d fenced)", generation)
	if _, err := g.git(ctx, gitOpts{stdin: strings.NewReader(in.String())}, "update-ref", "-m", msg, "--stdin"); err != nil {
		return fmt.Errorf("update refs: %w", err)
	}
	for _, r := range s.replaceRefs {
		rep.ReplaceRefsMoved = append(rep.ReplaceRefsMoved, r[0])
	}
	return nil
}

// removeChanged removes, below the worktree and never through a symlink,
// the ignored paths listed during the snapshot (except keep paths), every
// path the baseline does not have, and every changed .gitattributes, then
// the directories that became empty. checkoutBaseline writes the
// baseline's versions of the rest.
func (g *Guard) removeChanged(wfd int, s *snap) error {
	for _, p := range bytes.Split(s.ignored, []byte{0}) {
		rel := strings.TrimSuffix(string(p), "/")
		if rel == "" || g.isKept(rel) {
			continue
		}
		if err := g.removeRel(wfd, rel); err != nil {
			return err
		}
	}
	for _, e := range parseRaw(s.diff) {
		// Added paths go; modified ones stay until checkout-index
		// overwrites them (an interrupted restore then still finds their
		// content), except .gitattributes files: checkout-index reads
		// attributes from the worktree first, so only the baseline's may be
		// there when it runs.
		if e.status != 'A' && (e.status == 'D' || e.srcMode == "160000" || path.Base(e.path) != ".gitattributes") {
			continue
		}
		if err := g.removeRel(wfd, e.path); err != nil {
			return err
		}
		g.pruneEmptyParents(wfd, e.path)
	}
	return nil
}

// removeRel removes wt/rel and everything below it, except keep paths
// below it. A path that cannot exist (a parent is missing, or is not a
// directory but, say, a symlink) is not an error: nothing is followed.
func (g *Guard) removeRel(wfd int, rel string) error {
	pfd, base, err := openParentAt(wfd, rel)
	if err != nil {
		if isNotExist(err) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil
		}
		return err
	}
	defer unix.Close(pfd)
	if !g.hasKeptBelow(rel) {
		if err := removeAllAt(pfd, base); err != nil {
			return fmt.Errorf("remove %s: %w", rel, err)
		}
		return nil
	}
	fd, err := openDirAt(pfd, base)
	if err != nil {
		if isNotExist(err) {
			return nil
		}
		return removeAllAt(pfd, base) // not a directory: holds no keep path
	}
	names, err := readDirNames(fd)
	unix.Close(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if c := rel + "/" + n; !g.isKept(c) {
			if err := g.removeRel(wfd, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// hasKeptBelow reports whether a keep path lies strictly below rel.
func (g *Guard) hasKeptBelow(rel string) bool {
	for _, k := range g.keep {
		if strings.HasPrefix(k, rel+"/") {
			return true
		}
	}
	return false
}

// pruneEmptyParents removes the parent directories of rel that are empty,
// innermost first (rmdir: a directory that holds anything stays).
func (g *Guard) pruneEmptyParents(wfd int, rel string) {
	for dir := path.Dir(rel); dir != "." && dir != "/" && !g.isKept(dir); dir = path.Dir(dir) {
		pfd, base, err := openParentAt(wfd, dir)
		if err != nil {
			return
		}
		err = unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
		unix.Close(pfd)
		if err != nil {
			return
		}
	}
}

// checkoutBaseline gives the temporary index the baseline's entries for
// every path that differs (stageBaseline, unless the snapshot did already),
// writes those files (checkout-index -u, which
// records their stat data), and makes it the index. Entries that match
// the baseline keep the stat data the add just recorded, so nothing else
// is read or written.
func (g *Guard) checkoutBaseline(ctx context.Context, gfd int, s *snap) error {
	if !s.staged {
		if err := g.stageBaseline(ctx, s); err != nil {
			return err
		}
	}
	var co bytes.Buffer
	for _, e := range parseRaw(s.diff) {
		if e.status != 'A' {
			co.WriteString(e.path)
			co.WriteByte(0)
		}
	}
	if co.Len() > 0 {
		if _, err := g.git(ctx, gitOpts{index: g.tmpIndex, stdin: &co}, "checkout-index", "-f", "-u", "-z", "--stdin"); err != nil {
			return err
		}
	}
	if _, err := lstatAt(gfd, tmpIndexName); err != nil {
		if !isNotExist(err) {
			return err
		}
		// No index before and nothing to write (an empty baseline).
		return removeAllAt(gfd, "index")
	}
	if st, err := lstatAt(gfd, "index"); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := removeAllAt(gfd, "index"); err != nil {
			return err
		}
	}
	return unix.Renameat(gfd, tmpIndexName, gfd, "index")
}

// stageBaseline gives the temporary index the baseline's entries for every
// path that differs (update-index --index-info: removals first, so no
// file/directory conflict). Only the temporary index changes.
func (g *Guard) stageBaseline(ctx context.Context, s *snap) error {
	var rm, add bytes.Buffer
	for _, e := range parseRaw(s.diff) {
		if e.status == 'A' {
			fmt.Fprintf(&rm, "0 %s\t%s\x00", strings.Repeat("0", len(e.dstOID)), e.path)
			continue
		}
		fmt.Fprintf(&add, "%s %s\t%s\x00", e.srcMode, e.srcOID, e.path)
	}
	if rm.Len()+add.Len() > 0 {
		rm.Write(add.Bytes())
		if _, err := g.git(ctx, gitOpts{index: g.tmpIndex, stdin: &rm}, "update-index", "-z", "--index-info"); err != nil {
			return err
		}
	}
	s.staged = true
	return nil
}

// listReplaceRefs lists refs/replace/* (name, object).
func (g *Guard) listReplaceRefs(ctx context.Context) ([][2]string, error) {
	out, err := g.git(ctx, gitOpts{}, "for-each-ref", "--format=%(refname)%00%(objectname)", "refs/replace/")
	if err != nil {
		return nil, err
	}
	var refs [][2]string
	for _, line := range strings.Split(string(out), "\n") {
		name, oid, ok := strings.Cut(line, "\x00")
		if ok && strings.HasPrefix(name, "refs/replace/") && isHex(oid) {
			refs = append(refs, [2]string{name, oid})
		}
	}
	return refs, nil
}

// replaceRefCommands are the update-ref --stdin lines that move each
// replace ref to refs/shim/replace/<gen>/<name> (never through a symref).
func replaceRefCommands(generation uint64, refs [][2]string) string {
	var b strings.Builder
	for _, r := range refs {
		dst := ReplaceRefPrefix + strconv.FormatUint(generation, 10) + "/" + strings.TrimPrefix(r[0], "refs/replace/")
		fmt.Fprintf(&b, "option no-deref\nupdate %s %s\noption no-deref\ndelete %s\n", dst, r[1], r[0])
	}
	return b.String()
}

// describe fills the report's path list, counts, nested repositories,
// ignored files and local commits (objects only; runs beside the reset).
func (g *Guard) describe(ctx context.Context, s *snap, rep *Report) error {
	return parallel(
		func() error {
			// The snapshot's tree is the temporary index, unless an
			// existing snapshot that holds more was kept.
			out := s.diff
			if s.reused {
				var err error
				if out, err = g.git(ctx, gitOpts{}, "diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-abbrev", s.baselineTree, s.commit); err != nil {
					return err
				}
			}
			fillChanges(out, &rep.Paths, &rep.PathsTruncated, &rep.Modified, &rep.Added, &rep.Deleted, &rep.NestedRepos)
			return nil
		},
		func() error {
			for _, p := range bytes.Split(s.ignored, []byte{0}) {
				if len(p) == 0 || g.isKept(string(p)) {
					continue
				}
				if len(rep.Ignored) >= maxListed {
					rep.IgnoredTruncated = true
					break
				}
				rep.Ignored = append(rep.Ignored, string(p))
			}
			var heads []string
			for _, p := range s.parents {
				if p != s.baseline {
					heads = append(heads, p)
				}
			}
			if len(heads) == 0 {
				return nil
			}
			args := append(append([]string{"rev-list", "--count"}, heads...), "--not", s.baseline)
			out, err := g.git(ctx, gitOpts{}, args...)
			if err != nil {
				return err
			}
			rep.LocalCommits, err = strconv.Atoi(strings.TrimSpace(string(out)))
			return err
		},
	)
}

// fillChanges parses `diff-tree -r -z --raw` output.
func fillChanges(out []byte, paths *[]PathChange, truncated *bool, modified, added, deleted *int, nested *[]string) {
	f := bytes.Split(out, []byte{0})
	for i := 0; i+1 < len(f); i += 2 {
		meta := strings.Fields(strings.TrimPrefix(string(f[i]), ":"))
		if len(meta) < 5 {
			continue
		}
		path := string(f[i+1])
		var change string
		switch meta[4][0] {
		case 'A':
			*added++
			change = "added"
		case 'D':
			*deleted++
			change = "deleted"
		case 'T':
			*modified++
			change = "type_changed"
		default:
			*modified++
			change = "modified"
		}
		if meta[1] == "160000" && meta[0] != "160000" && nested != nil {
			*nested = append(*nested, path)
		}
		if len(*paths) >= maxListed {
			*truncated = true
			continue
		}
		*paths = append(*paths, PathChange{Path: path, Change: change})
	}
}

// verify checks that HEAD is the baseline, that the index and every
// tracked file equal it (diff-index HEAD: index entries against the tree,
// files against the index's stat data), and that nothing untracked,
// ignored or not, is left outside the keep paths (ls-files --others
// without exclude rules). Untracked directories that hold nothing but
// directories (or fifos and sockets) are removed here; anything else left
// is RESTORE_FAILED.
func (g *Guard) verify(ctx context.Context, wfd int, baseline string) error {
	var head, changed, others []byte
	excl := g.excludePathspecs()
	err := parallel(
		func() (err error) {
			head, err = g.git(ctx, gitOpts{}, "rev-parse", "-q", "--verify", "HEAD^{commit}")
			return err
		},
		func() (err error) {
			args := append([]string{"diff-index", "-z", "--name-only", "--no-renames", "--ignore-submodules=all", "HEAD", "--", "."}, excl...)
			changed, err = g.git(ctx, gitOpts{}, args...)
			return err
		},
		func() (err error) {
			args := append([]string{"ls-files", "-z", "--others", "--directory", "--", "."}, excl...)
			others, err = g.git(ctx, gitOpts{}, args...)
			return err
		},
	)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "verify")
	}
	if h := strings.TrimSpace(string(head)); h != baseline {
		return errorf(CodeRestoreFailed, nil, "verify: HEAD is %s, not the baseline %s", h, baseline)
	}
	var left []string
	for _, p := range bytes.Split(changed, []byte{0}) {
		if len(p) > 0 {
			left = append(left, "changed "+string(p))
		}
	}
	for _, p := range bytes.Split(others, []byte{0}) {
		rel := strings.TrimSuffix(string(p), "/")
		if rel == "" || g.isKept(rel) {
			continue
		}
		if !g.removeEmpty(wfd, rel) {
			left = append(left, "untracked "+string(p))
		}
	}
	if len(left) > 0 {
		n := len(left)
		if n > 20 {
			left = left[:20]
		}
		return errorf(CodeRestoreFailed, nil, "verify: %d entries differ from the baseline after reset and clean: %s", n, strings.Join(left, "; "))
	}
	return nil
}

// removeEmpty removes wt/rel if it holds no data: a directory whose
// entries are all such (keep paths below it stay, and so does it), a fifo
// or a socket. It reports false, removing nothing more, at the first
// regular file, symlink or device, and never follows a symlink.
func (g *Guard) removeEmpty(wfd int, rel string) bool {
	pfd, base, err := openParentAt(wfd, rel)
	if err != nil {
		return false
	}
	defer unix.Close(pfd)
	st, err := lstatAt(pfd, base)
	if err != nil {
		return isNotExist(err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFIFO, unix.S_IFSOCK:
		return unix.Unlinkat(pfd, base, 0) == nil
	case unix.S_IFDIR:
	default:
		return false
	}
	fd, err := openDirAt(pfd, base)
	if err != nil {
		return false
	}
	names, err := readDirNames(fd)
	unix.Close(fd)
	if err != nil {
		return false
	}
	kept := false
	for _, n := range names {
		c := rel + "/" + n
		if g.isKept(c) {
			kept = true
			continue
		}
		if !g.removeEmpty(wfd, c) {
			return false
		}
	}
	return kept || unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR) == nil
}

// saveTrustedIndex copies the index git wrote (keeping its mtime, which
// git's racy-entry check compares against) into StateDir.
func (g *Guard) saveTrustedIndex(gfd int) error {
	data, st, err := readFileAt(gfd, "index", 1<<31)
	if err != nil {
		return err
	}
	mt := st.Mtim
	if err := writeFileAtomic(filepath.Join(g.cfg.StateDir, trustedIndex), data, &mt); err != nil {
		return err
	}
	if !g.st.HasIndex {
		g.st.HasIndex = true
		b, _ := jsonMarshal(g.st)
		return writeFileAtomic(filepath.Join(g.cfg.StateDir, stateFile), b, nil)
	}
	return nil
}

// isKept reports whether a worktree-relative path (a directory may end
// in "/") is a keep path or below one.
func (g *Guard) isKept(p string) bool {
	p = strings.TrimSuffix(p, "/")
	for _, k := range g.keep {
		if p == k || strings.HasPrefix(p, k+"/") {
			return true
		}
	}
	return false
}

// excludePathspecs are the pathspecs that leave the keep paths out.
func (g *Guard) excludePathspecs() []string {
	var ps []string
	for _, k := range g.keep {
		ps = append(ps, ":(exclude,literal)"+k)
	}
	return ps
}

// escapeGlob makes a literal path usable as a gitignore pattern.
func escapeGlob(p string) string {
	var b strings.Builder
	for _, r := range p {
		switch r {
		case '\\', '*', '?', '[', ']', '!', '#':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	s := b.String()
	if strings.HasSuffix(s, " ") {
		s = strings.TrimSuffix(s, " ") + "\\ "
	}
	return s
}

// objInfo is one answer of cat-file --batch-check ("" type when missing).
type objInfo struct{ oid, typ string }

func (g *Guard) lookup(ctx context.Context, queries []string) ([]objInfo, error) {
	in := strings.Join(queries, "\n") + "\n"
	out, err := g.git(ctx, gitOpts{stdin: strings.NewReader(in)}, "cat-file", "--batch-check")
	if err != nil {
		return nil, err
	}
	res := make([]objInfo, 0, len(queries))
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && isHex(f[0]) {
			res = append(res, objInfo{oid: f[0], typ: f[1]})
		} else {
			res = append(res, objInfo{})
		}
	}
	if len(res) != len(queries) {
		return nil, fmt.Errorf("cat-file answered %d of %d lookups", len(res), len(queries))
	}
	return res, nil
}

// validRev accepts a revision for git: no option look-alike, no whitespace
// or control characters (they would break cat-file's line protocol).
func validRev(rev string) error {
	if rev == "" || len(rev) > 1024 || strings.HasPrefix(rev, "-") {
		return errorf(CodeBadRequest, nil, "invalid revision %q", rev)
	}
	for _, r := range rev {
		if r <= ' ' || r == 0x7f {
			return errorf(CodeBadRequest, nil, "invalid revision %q", rev)
		}
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
