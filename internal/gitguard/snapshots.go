package gitguard

import (
	"bytes"
	"context"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shimdev/shim/internal/gitformat"
)

// ResolveBaseline resolves a commit id or a ref (e.g.
// refs/remotes/origin/main) to a full commit id with hardened git. Resolve
// a ref before the harness it fences could have moved it; a commit id is
// preferred.
func (g *Guard) ResolveBaseline(ctx context.Context, rev string) (string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := validRev(rev); err != nil {
		return "", err
	}
	if err := g.open(false); err != nil {
		return "", err
	}
	// A ref name resolves among the trusted refs (the refs as the last
	// restore or the registration left them), never among refs a harness
	// moved since.
	target := rev
	if t, err := g.loadTrustedRefs(); err == nil && t != nil && g.st != nil {
		g.trusted = t
		target = g.trustedRev(rev)
	}
	res, err := g.lookup(ctx, []string{target + "^{commit}"})
	if err != nil {
		return "", errorf(CodeInternal, err, "resolve %q", rev)
	}
	if res[0].typ != "commit" {
		return "", errorf(CodeNotFound, nil, "%q is not a commit in %s", rev, g.name)
	}
	return res[0].oid, nil
}

// List returns the saved generations, newest (highest generation) first,
// without their path lists but with the counts Show gives (modified,
// added, deleted against the baseline).
func (g *Guard) List(ctx context.Context) ([]Snapshot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(false); err != nil {
		return nil, err
	}
	snaps, err := g.list(ctx)
	if err != nil {
		return nil, err
	}
	g.count(ctx, snaps)
	return snaps, nil
}

// count fills the counts of every snapshot that names its baseline, as
// Show's diff-tree does, with one git for the whole list: diff-tree
// --stdin diffs each "commit baseline" line, and its output streams
// through a counter (bounded memory, however much a harness changed). A
// snapshot whose counts git cannot give (its baseline pruned) keeps 0s,
// as Show would fail for it.
func (g *Guard) count(ctx context.Context, snaps []Snapshot) {
	var in strings.Builder
	for _, s := range snaps {
		if gitformat.IsObjectName(s.Commit) && gitformat.IsObjectName(s.Baseline) {
			in.WriteString(s.Commit + " " + s.Baseline + "\n")
		}
	}
	if in.Len() == 0 {
		return
	}
	c := &rawCounter{counts: map[string]*[3]int{}}
	if _, err := g.git(ctx, gitOpts{stdin: strings.NewReader(in.String()), stdout: c, quiet: true},
		"diff-tree", "--stdin", "-r", "-z", "--raw", "--no-renames", "--no-abbrev"); err != nil {
		return
	}
	for i := range snaps {
		if n, ok := c.counts[snaps[i].Commit]; ok {
			snaps[i].Modified, snaps[i].Added, snaps[i].Deleted = n[0], n[1], n[2]
		}
	}
}

// rawCounter counts `diff-tree --stdin -z --raw` output per commit: a
// header (the commit id), then for each change a ":modes oids status"
// token and a path token, every token NUL-terminated. It keeps only the
// head of the token it is in.
type rawCounter struct {
	counts map[string]*[3]int // commit -> modified, added, deleted
	cur    *[3]int
	tok    []byte // the token so far, its first maxTokHead bytes
	path   bool   // the token is a path (it follows a status token)
}

const maxTokHead = 160 // a header or a status token fits

func (c *rawCounter) Write(p []byte) (int, error) {
	for _, b := range p {
		if b != 0 {
			if len(c.tok) < maxTokHead {
				c.tok = append(c.tok, b)
			}
			continue
		}
		c.token()
		c.tok = c.tok[:0]
	}
	return len(p), nil
}

// token takes one whole token, classified as fillChanges does.
func (c *rawCounter) token() {
	switch {
	case c.path:
		c.path = false
	case len(c.tok) > 0 && c.tok[0] == ':':
		c.path = true
		f := strings.Fields(string(c.tok[1:]))
		if len(f) < 5 || c.cur == nil {
			return
		}
		switch f[4][0] {
		case 'A':
			c.cur[1]++
		case 'D':
			c.cur[2]++
		default:
			c.cur[0]++
		}
	case len(c.tok) > 0:
		c.cur = &[3]int{}
		c.counts[string(c.tok)] = c.cur
	}
}

func (g *Guard) list(ctx context.Context) ([]Snapshot, error) {
	out, err := g.git(ctx, gitOpts{}, "for-each-ref",
		"--format=%(refname)%00%(objectname)%00%(objecttype)%00%(committerdate:unix)%00%(contents)%01", RefPrefix)
	if err != nil {
		return nil, errorf(CodeInternal, err, "list snapshots")
	}
	var snaps []Snapshot
	for _, rec := range bytes.Split(out, []byte{1}) {
		f := strings.SplitN(strings.TrimLeft(string(rec), "\n"), "\x00", 5)
		if len(f) < 5 || f[2] != "commit" {
			continue
		}
		gen, err := strconv.ParseUint(strings.TrimPrefix(f[0], RefPrefix), 10, 64)
		if err != nil {
			continue // not one of ours
		}
		s := Snapshot{Generation: gen, Ref: f[0], Commit: f[1]}
		if sec, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			s.Created = time.Unix(sec, 0).UTC()
		}
		s.Baseline, s.HeadBefore = parseTrailers(f[4])
		snaps = append(snaps, s)
	}
	sort.Slice(snaps, func(i, j int) bool { return snaps[i].Generation > snaps[j].Generation })
	return snaps, nil
}

// parseTrailers reads Shim-Baseline and Shim-Head from a snapshot message.
func parseTrailers(msg string) (baseline, head string) {
	for _, line := range strings.Split(msg, "\n") {
		if v, ok := strings.CutPrefix(line, "Shim-Baseline: "); ok && strings.TrimSpace(v) != "none" {
			baseline = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "Shim-Head: "); ok && strings.TrimSpace(v) != "none" {
			head = strings.TrimSpace(v)
		}
	}
	return baseline, head
}

// Show returns one saved generation with the paths that differ from its
// baseline; NOT_FOUND when there is none.
func (g *Guard) Show(ctx context.Context, generation uint64) (*Snapshot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(false); err != nil {
		return nil, err
	}
	snaps, err := g.list(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range snaps {
		if s.Generation != generation {
			continue
		}
		s.Paths = []PathChange{}
		if s.Baseline != "" {
			out, err := g.git(ctx, gitOpts{}, "diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-abbrev", s.Baseline, s.Commit)
			if err != nil {
				return nil, errorf(CodeInternal, err, "diff %s against its baseline", s.Ref)
			}
			fillChanges(out, &s.Paths, &s.PathsTruncated, &s.Modified, &s.Added, &s.Deleted, nil)
		}
		return &s, nil
	}
	return nil, errorf(CodeNotFound, nil, "no snapshot of generation %d in %s", generation, g.name)
}

// Prune deletes all but the newest keep snapshot refs (keep >= 0) and
// returns the refs it removed. The commits stay in the object store until
// git's own gc expires them.
func (g *Guard) Prune(ctx context.Context, keep int) ([]string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if keep < 0 {
		return nil, errorf(CodeBadRequest, nil, "keep must be >= 0")
	}
	if err := g.open(false); err != nil {
		return nil, err
	}
	return g.prune(ctx, keep)
}

func (g *Guard) prune(ctx context.Context, keep int) ([]string, error) {
	snaps, err := g.list(ctx)
	if err != nil {
		return nil, err
	}
	if len(snaps) <= keep {
		return []string{}, nil
	}
	var in strings.Builder
	var removed []string
	gone := map[string]bool{}
	for _, s := range snaps[keep:] {
		in.WriteString("delete " + s.Ref + " " + s.Commit + "\n")
		removed = append(removed, s.Ref)
		gone[strconv.FormatUint(s.Generation, 10)] = true
	}
	// The refs kept for a pruned generation go with it.
	out, err := g.git(ctx, gitOpts{}, "for-each-ref", "--format=%(refname)", HarnessRefPrefix)
	if err != nil {
		return nil, errorf(CodeInternal, err, "list kept harness refs")
	}
	for _, n := range strings.Split(string(out), "\n") {
		gen, _, _ := strings.Cut(strings.TrimPrefix(n, HarnessRefPrefix), "/")
		if strings.HasPrefix(n, HarnessRefPrefix) && gone[gen] {
			in.WriteString("option no-deref\ndelete " + n + "\n")
		}
	}
	if _, err := g.git(ctx, gitOpts{stdin: strings.NewReader(in.String())}, "update-ref", "--stdin"); err != nil {
		return nil, errorf(CodeInternal, err, "delete snapshot refs")
	}
	return removed, nil
}

// SnapshotIs reports whether refs/shim/abandoned/<generation> names
// commit, a commit the repository has: a layer whose marker says commit
// may then go, its edits saved. An empty or broken ref (a power cut
// before it was synced), a missing object or a git that cannot answer is
// false: keep the layer.
func (g *Guard) SnapshotIs(ctx context.Context, generation uint64, commit string) bool {
	if !isHex(commit) {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(true); err != nil {
		return false
	}
	res, err := g.lookup(ctx, []string{RefPrefix + strconv.FormatUint(generation, 10), commit})
	return err == nil && res[0].oid == commit && res[0].typ == "commit" && res[1].typ == "commit"
}
