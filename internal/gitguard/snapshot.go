package gitguard

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// snap carries what the snapshot step learned to the later steps.
type snap struct {
	// baseline and its tree; both "" when the revision did not resolve to
	// a commit (then the snapshot is all that happens).
	baseline, baselineTree string
	// existing is the generation's earlier snapshot (a repeated or
	// interrupted Restore), with its tree; "" when there is none.
	existing, existingTree string
	commit                 string
	parents                []string    // abandoned heads (not the old snapshot)
	ignored                []byte      // ls-files output
	replaceRefs            [][2]string // refs/replace/* found: name, object
	nested                 []string    // nested repositories without a commit, left out
	notStored              []NotStoredFile
	skipped                []string // untracked paths not stored: removed by the clean
	diff                   []byte   // diff-index --cached -z --raw <baseline> of the temporary index
	reused                 bool     // the generation's existing snapshot was kept
	staged                 bool     // the temporary index has the baseline's entries (stageBaseline)
}

// snapshot records the worktree in a temporary index seeded from the
// trusted one and commits it under ref: the baseline's tree plus what
// differs from it, with the abandoned heads as parents. When rev does not
// resolve, the whole tree is saved and the error says so.
func (g *Guard) snapshot(ctx context.Context, gfd, wfd int, generation uint64, rev, ref string, heads *refsResult, rep *Report) (*snap, error) {
	s, err := g.snapshotInputs(ctx, rev, ref, heads, rep)
	if err != nil {
		return nil, err
	}
	if err := g.seedTmpIndex(gfd); err != nil {
		return nil, err
	}
	if err := g.listWorktree(ctx, wfd, s, rep); err != nil {
		return nil, err
	}
	if s.baseline == "" {
		return nil, g.saveUnresolved(ctx, generation, rev, ref, s, rep)
	}
	// Every path where the worktree differs from the baseline: what the
	// snapshot adds to the baseline's tree, what the reset rewrites and
	// what the report lists.
	s.diff, err = g.git(ctx, gitOpts{index: g.tmpIndex}, "diff-index", "--cached", "-z", "--raw", "--no-renames", "--no-abbrev", s.baseline)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "snapshot: diff-index")
	}
	if g.moveOnly && s.existing != "" {
		// The worktree holds nothing but the baseline it was restored to
		// (a layer's lower, or a worktree restored a moment ago): it is
		// moved, and the generation's snapshot stays as it is (what the
		// worktree differs by from the new baseline is no edit of the
		// generation's).
		s.commit, s.reused = s.existing, true
		rep.SnapshotCommit, rep.SnapshotReused = s.existing, true
		return s, nil
	}
	msg := snapshotMessage(generation, g.name, s.baseline, rep.HeadBefore) + notStoredTrailers(s.notStored)
	if s.existing == "" {
		err = g.importSnapshot(ctx, s, msg, ref, rep)
	} else {
		err = g.extendSnapshot(ctx, generation, s, msg, ref, rep)
	}
	if err != nil {
		return nil, err
	}
	// Durable before the reset, and before the fence's state says the
	// generation was restored.
	if err := g.syncRef(ref); err != nil {
		return nil, errorf(CodeRestoreFailed, err, "snapshot: sync the snapshot ref")
	}
	return s, nil
}

// snapshotInputs resolves, with one cat-file, the baseline, the abandoned
// HEAD, the pristine branch and the generation's existing snapshot. The
// baseline is resolved here, after the pristine metadata and the trusted
// refs are back (see trustedRev). The abandoned HEAD and branch are what
// the ref namespace step read before it put the trusted refs back (heads),
// or, without that step, the refs as the harness left them.
func (g *Guard) snapshotInputs(ctx context.Context, rev, ref string, heads *refsResult, rep *Report) (*snap, error) {
	branch := g.pristineBranch()
	target := g.trustedRev(rev)
	headQ, branchQ := "HEAD", branch
	if heads != nil {
		headQ, branchQ = heads.head, heads.branch
	}
	queries := []string{target + "^{commit}", target + "^{tree}", ref, ref + "^{tree}"}
	at := func(q string) int {
		if q == "" {
			return -1
		}
		queries = append(queries, q)
		return len(queries) - 1
	}
	hi, bi := at(headQ), at(branchQ)
	res, err := g.lookup(ctx, queries)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "look up baseline %q and HEAD", rev)
	}
	commit := func(i int) string {
		if i < 0 || res[i].typ != "commit" {
			return ""
		}
		return res[i].oid
	}
	s := &snap{}
	if res[0].typ == "commit" {
		s.baseline, s.baselineTree = res[0].oid, res[1].oid
		rep.Baseline = s.baseline
	}
	if h := commit(hi); h != "" {
		rep.HeadBefore = h
		s.parents = append(s.parents, h)
	}
	if b := commit(bi); b != "" && b != rep.HeadBefore {
		s.parents = append(s.parents, b)
	}
	if len(s.parents) == 0 && s.baseline != "" {
		s.parents = []string{s.baseline}
	}
	switch res[2].typ {
	case "commit":
		s.existing, s.existingTree = res[2].oid, res[3].oid
	case "":
	default:
		return nil, errorf(CodeRestoreFailed, nil, "%s exists but is a %s, not a commit", ref, res[2].typ)
	}
	return s, nil
}

// trustedRev is the revision to resolve for rev: HEAD means the HEAD of
// the registration (the pristine branch, or its detached commit), not the
// one the harness left. With the ref namespace kept, a ref name (as git's
// rules expand it: main, origin/main, refs/remotes/origin/main, a tag)
// resolves among the trusted refs only, to their object id; a ref name
// they do not have resolves to nothing (never to a file a harness planted
// where git's rules look, such as .git/origin/main). Object ids and
// expressions (main~1) go to git, among the trusted refs on disk by then.
func (g *Guard) trustedRev(rev string) string {
	if rev == "HEAD" {
		if b := g.pristineBranch(); b != "" {
			rev = b
		} else {
			return strings.TrimSpace(g.st.Head)
		}
	}
	if g.trusted == nil {
		return rev
	}
	if oid, isName := g.trusted.dwim(rev); isName {
		return oid // "" when the trusted refs do not have it
	}
	return rev
}

// seedTmpIndex copies the trusted index into the temporary one: only files
// whose stat data changed since git last recorded them are read again.
func (g *Guard) seedTmpIndex(gfd int) error {
	if !g.st.HasIndex {
		if err := removeAllAt(gfd, tmpIndexName); err != nil {
			return errorf(CodeRestoreFailed, err, "clear temporary index")
		}
		return nil
	}
	path := g.stateFile(trustedIndex)
	data, err := readFileTrusted(path)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "read trusted index")
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return errorf(CodeRestoreFailed, err, "stat trusted index")
	}
	mt := st.Mtim
	if err := writeFileAt(gfd, tmpIndexName, data, 0o600, g.uid, g.gid, &mt); err != nil {
		return errorf(CodeRestoreFailed, err, "seed temporary index")
	}
	return nil
}

// snapshotMessage is the snapshot commit's message, with the trailers List
// reads back.
func snapshotMessage(generation uint64, wt, baseline, head string) string {
	return fmt.Sprintf("shim: abandoned edits of generation %d\n\nSaved by shim before resetting %s to %s.\n\nShim-Generation: %d\nShim-Baseline: %s\nShim-Head: %s\n",
		generation, wt, baseline, generation, baseline, orNone(head))
}

// importSnapshot is the common case: trees and commit go into one pack
// through fast-import, which also creates the ref. The temporary index
// gets the baseline's entries (for the reset) while fast-import runs:
// fast-import reads only the diff, and the worktree and the real index
// stay as they are until the ref exists.
func (g *Guard) importSnapshot(ctx context.Context, s *snap, msg, ref string, rep *Report) error {
	err := parallel(
		func() (err error) {
			if s.commit, err = g.fastImport(ctx, s.parents, s.baselineTree, s.diff, msg, ref); err != nil {
				return errorf(CodeRestoreFailed, err, "snapshot: fast-import")
			}
			if err := g.trustRefs(map[string]string{ref: s.commit}); err != nil {
				return errorf(CodeRestoreFailed, err, "snapshot: record %s as trusted", ref)
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
	return err
}

// extendSnapshot handles a generation that already has a snapshot: it is
// kept when it holds everything the worktree holds now; otherwise a new
// one is recorded with the old one as an extra parent, so it stays
// reachable.
func (g *Guard) extendSnapshot(ctx context.Context, generation uint64, s *snap, msg, ref string, rep *Report) error {
	tree, err := g.writeTree(ctx, false)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "snapshot: write-tree")
	}
	reuse, err := g.coveredBy(ctx, s.existing, s.existingTree, tree, s)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "compare with the existing snapshot %s", s.existing)
	}
	if reuse {
		s.commit, s.reused = s.existing, true
		rep.SnapshotCommit, rep.SnapshotReused = s.existing, true
		return nil
	}
	parents := append(append([]string{}, s.parents...), s.existing)
	if s.commit, err = g.commitSnapshot(ctx, generation, tree, parents, msg, ref, s.existing); err != nil {
		return errorf(CodeRestoreFailed, err, "snapshot")
	}
	rep.SnapshotCommit = s.commit
	return nil
}

// saveUnresolved saves the worktree when the baseline does not resolve to a
// commit (a ref that does not exist, objects a harness deleted): with
// nothing to compare against, the snapshot is the temporary index's whole
// tree (objects the harness deleted stay missing: --missing-ok), and the
// restore fails before anything is reset. The error says what was saved.
func (g *Guard) saveUnresolved(ctx context.Context, generation uint64, rev, ref string, s *snap, rep *Report) error {
	why := fmt.Sprintf("baseline %q does not resolve to a commit in %s (looked up after the pristine git metadata was put back); nothing was reset", rev, g.name)
	tree, err := g.writeTree(ctx, true)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "%s, and the edits could not be saved", why)
	}
	if s.existing != "" && tree == s.existingTree {
		s.commit, s.reused = s.existing, true
		rep.SnapshotCommit, rep.SnapshotReused = s.existing, true
		return errorf(CodeRestoreFailed, nil, "%s; the worktree is as already saved in %s (%s)", why, ref, s.existing)
	}
	parents := s.parents
	if s.existing != "" {
		parents = append(append([]string{}, parents...), s.existing)
	}
	msg := fmt.Sprintf("shim: abandoned edits of generation %d\n\nSaved by shim; the baseline %s did not resolve to a commit, so %s was not reset and this commit holds the whole worktree.\n\nShim-Generation: %d\nShim-Baseline: none\nShim-Baseline-Rev: %s\nShim-Head: %s\n",
		generation, rev, g.name, generation, rev, orNone(rep.HeadBefore))
	if s.commit, err = g.commitSnapshot(ctx, generation, tree, parents, msg, ref, s.existing); err != nil {
		return errorf(CodeRestoreFailed, err, "%s, and the edits could not be saved", why)
	}
	rep.SnapshotCommit = s.commit
	return errorf(CodeRestoreFailed, nil, "%s; the edits were saved as the whole worktree (no baseline to compare with) in %s under %s", why, s.commit, ref)
}

// writeTree writes the temporary index's tree.
func (g *Guard) writeTree(ctx context.Context, missingOK bool) (string, error) {
	args := []string{"write-tree"}
	if missingOK {
		args = append(args, "--missing-ok")
	}
	out, err := g.git(ctx, gitOpts{index: g.tmpIndex}, args...)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// commitSnapshot commits tree with parents and moves ref to it from old
// ("" when ref must not exist yet).
func (g *Guard) commitSnapshot(ctx context.Context, generation uint64, tree string, parents []string, msg, ref, old string) (string, error) {
	args := []string{"commit-tree", "--no-gpg-sign", tree}
	for _, p := range parents {
		args = append(args, "-p", p)
	}
	args = append(args, "-F", "-")
	out, err := g.git(ctx, gitOpts{stdin: strings.NewReader(msg), env: shimIdent}, args...)
	if err != nil {
		return "", fmt.Errorf("commit-tree: %w", err)
	}
	commit := strings.TrimSpace(string(out))
	if _, err := g.git(ctx, gitOpts{}, "update-ref", "-m", fmt.Sprintf("shim: save generation %d", generation), ref, commit, old); err != nil {
		return "", fmt.Errorf("update-ref %s: %w", ref, err)
	}
	if err := g.trustRefs(map[string]string{ref: commit}); err != nil {
		return "", fmt.Errorf("record %s as trusted: %w", ref, err)
	}
	return commit, nil
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
func quotePath(p string) string { return gitformat.QuotePath(p) }

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
