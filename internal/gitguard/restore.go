package gitguard

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
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
//     -A` (no filter runs, blobs into one pack), then one fast-import
//     writes the trees and the commit, with the abandoned HEAD (and the
//     pristine branch, if it differs) as parents, and creates
//     refs/shim/abandoned/<generation>;
//  3. clean and reset: HEAD back to the pristine branch, the trusted index
//     back in place, `clean -ffdx` (except Config.KeepPaths), then `reset
//     --hard <baseline>`;
//  4. verify: `status` must show HEAD at the baseline and nothing else.
//
// Nothing is reset before the snapshot ref is written. A failure at any
// step is RESTORE_FAILED (BAD_REQUEST for a baseline that is not a commit).
// Restore is idempotent: repeated after an interruption it reuses the
// generation's snapshot when it already holds everything (never replacing
// it with an emptier one) and otherwise records a new snapshot whose parents
// include the old one.
func (g *Guard) Restore(ctx context.Context, generation uint64, baseline string) (*Report, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	start := time.Now()
	if err := validRev(baseline); err != nil {
		return nil, err
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
	sn, err := g.snapshot(ctx, gfd, generation, baseline, ref, rep)
	step("snapshot", t)
	if err != nil {
		return rep, err
	}

	// Nested repositories git could not record are moved into the git
	// dir before anything is cleaned, so their files are kept.
	if len(sn.nested) > 0 {
		if rep.NestedReposMovedTo, err = g.moveNested(gfd, generation, sn.nested); err != nil {
			return rep, errorf(CodeRestoreFailed, err, "move nested repositories aside")
		}
		rep.NestedRepos = append(rep.NestedRepos, sn.nested...)
	}

	// Replace refs the harness left would fool the next harness's git
	// (and a user's): move them out of refs/replace/.
	if err := g.moveReplaceRefs(ctx, generation, sn, rep); err != nil {
		return rep, errorf(CodeRestoreFailed, err, "move replace refs")
	}

	// 3. clean, then reset. Cleaning first (against the trusted index now
	// in place) removes untracked .gitattributes files before the checkout
	// could apply them, and leaves only tracked paths, so reset leaves
	// nothing behind. The report's diff and commit count run alongside.
	t = time.Now()
	if err := g.prepareReset(gfd, sn.baseline); err != nil {
		return rep, errorf(CodeRestoreFailed, err, "prepare reset")
	}
	cleanArgs := []string{"clean", "-ffdxq"}
	for _, k := range g.keep {
		cleanArgs = append(cleanArgs, "-e", "/"+escapeGlob(k))
	}
	var resetDur time.Duration
	err = parallel(
		func() error {
			if _, err := g.git(ctx, gitOpts{}, cleanArgs...); err != nil {
				return fmt.Errorf("clean: %w", err)
			}
			rep.DurationsMS["clean"] = ms(time.Since(t))
			r := time.Now()
			err := g.reset(ctx, gfd, sn.baseline)
			resetDur = time.Since(r)
			return err
		},
		func() error { return g.describe(ctx, sn, rep) },
	)
	rep.DurationsMS["reset"] = ms(resetDur)
	if err != nil {
		return rep, errorf(CodeRestoreFailed, err, "reset to %s", sn.baseline)
	}

	// 4. verify
	t = time.Now()
	err = g.verify(ctx, sn.baseline)
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
	defer func() {
		_ = removeAllAt(gfd, tmpIndexName)
		_ = removeAllAt(gfd, tmpIndexName+".lock")
	}()

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
	msg := fmt.Sprintf("shim: abandoned edits of generation %d\n\nSaved by shim before resetting %s to %s.\n\nShim-Generation: %d\nShim-Baseline: %s\nShim-Head: %s\n",
		generation, g.wt, s.baseline, generation, s.baseline, orNone(rep.HeadBefore))
	if existing == "" {
		// The common case: trees and commit go into one pack through
		// fast-import, which also creates the ref.
		if s.commit, err = g.fastImport(ctx, s.parents, msg, ref); err != nil {
			return nil, errorf(CodeRestoreFailed, err, "snapshot: fast-import")
		}
		rep.SnapshotCommit = s.commit
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
// temporary index: diff-index lists what differs from the first parent and
// fast-import writes the trees and the commit into one pack. Loose objects
// cost a file each (most of a naive snapshot's time on a slow disk).
func (g *Guard) fastImport(ctx context.Context, parents []string, msg, ref string) (string, error) {
	out, err := g.git(ctx, gitOpts{index: g.tmpIndex}, "diff-index", "--cached", "-z", "--raw", "--no-renames", "--no-abbrev", parents[0])
	if err != nil {
		return "", err
	}
	var in bytes.Buffer
	fmt.Fprintf(&in, "commit %s\nmark :1\ncommitter shim <shim@localhost> %d +0000\ndata %d\n%s\nfrom %s\n",
		ref, time.Now().Unix(), len(msg), msg, parents[0])
	for _, p := range parents[1:] {
		fmt.Fprintf(&in, "merge %s\n", p)
	}
	f := bytes.Split(out, []byte{0})
	for i := 0; i+1 < len(f); i += 2 {
		meta := strings.Fields(strings.TrimPrefix(string(f[i]), ":"))
		if len(meta) < 5 {
			continue
		}
		path := quotePath(string(f[i+1]))
		if meta[4] == "D" {
			fmt.Fprintf(&in, "D %s\n", path)
		} else {
			fmt.Fprintf(&in, "M %s %s %s\n", meta[1], meta[3], path)
		}
	}
	in.WriteString("\nget-mark :1\ndone\n")
	out, err = g.git(ctx, gitOpts{stdin: &in, config: []string{"fastimport.unpackLimit=0"}},
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

// prepareReset points HEAD back at the pristine branch (so every generation
// starts on the same branch, which reset then moves to the baseline) and
// puts the trusted index in place of the harness's, whose stat data could be
// forged to hide an edit from reset and status.
func (g *Guard) prepareReset(gfd int, baseline string) error {
	head := g.st.Head
	if !strings.HasPrefix(head, "ref: ") {
		head = baseline + "\n"
	}
	if cur, _, err := readFileAt(gfd, "HEAD", 4096); err != nil || string(cur) != head {
		if err := writeFileAt(gfd, "HEAD", []byte(head), 0o644, g.uid, g.gid, nil); err != nil {
			return err
		}
	}
	if !g.st.HasIndex {
		return removeAllAt(gfd, "index")
	}
	p := filepath.Join(g.cfg.StateDir, trustedIndex)
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	mt := st.Mtim
	return writeFileAt(gfd, "index", data, 0o644, g.uid, g.gid, &mt)
}

// reset runs reset --hard; if the index cannot be read it retries once
// without one (git then rewrites every file).
func (g *Guard) reset(ctx context.Context, gfd int, baseline string) error {
	_, err := g.git(ctx, gitOpts{}, "reset", "--hard", "-q", baseline)
	if err == nil {
		return nil
	}
	if rerr := removeAllAt(gfd, "index"); rerr != nil {
		return err
	}
	_, err2 := g.git(ctx, gitOpts{}, "reset", "--hard", "-q", baseline)
	if err2 != nil {
		return fmt.Errorf("%w; again without an index: %v", err, err2)
	}
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

// moveReplaceRefs moves the replace refs found during the snapshot in one
// transaction and lists them in the report.
func (g *Guard) moveReplaceRefs(ctx context.Context, generation uint64, s *snap, rep *Report) error {
	if len(s.replaceRefs) == 0 {
		return nil
	}
	in := replaceRefCommands(generation, s.replaceRefs)
	if _, err := g.git(ctx, gitOpts{stdin: strings.NewReader(in)}, "update-ref", "-m", "shim: move replace ref aside", "--stdin"); err != nil {
		return err
	}
	for _, r := range s.replaceRefs {
		rep.ReplaceRefsMoved = append(rep.ReplaceRefsMoved, r[0])
	}
	return nil
}

// describe fills the report's path list, counts, nested repositories,
// ignored files and local commits (objects only; runs beside the reset).
func (g *Guard) describe(ctx context.Context, s *snap, rep *Report) error {
	return parallel(
		func() error {
			out, err := g.git(ctx, gitOpts{}, "diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-abbrev", s.baselineTree, s.commit)
			if err != nil {
				return err
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

// verify checks with git status that HEAD is the baseline, the index and
// worktree equal it, and nothing untracked or ignored is left (outside the
// keep paths).
func (g *Guard) verify(ctx context.Context, baseline string) error {
	args := append([]string{"status", "--porcelain=v2", "-z", "--branch", "--untracked-files=all",
		"--ignored=traditional", "--ignore-submodules=all", "--no-renames", "--", "."}, g.excludePathspecs()...)
	out, err := g.git(ctx, gitOpts{}, args...)
	if err != nil {
		return errorf(CodeRestoreFailed, err, "verify: status")
	}
	var left []string
	head := ""
	for _, e := range bytes.Split(out, []byte{0}) {
		s := string(e)
		switch {
		case s == "":
		case strings.HasPrefix(s, "# branch.oid "):
			head = strings.TrimPrefix(s, "# branch.oid ")
		case strings.HasPrefix(s, "# "):
		default:
			left = append(left, s)
		}
	}
	if head != baseline {
		return errorf(CodeRestoreFailed, nil, "verify: HEAD is %s, not the baseline %s", head, baseline)
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
