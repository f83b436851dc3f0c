package gitguard

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// The ref namespace is trusted metadata too: a harness that moves
// refs/remotes/origin/main, adds a branch or a tag, edits packed-refs or
// plants a ref under refs/shim/ must not change what the next generation
// (or a baseline given as a ref) finds. gitguard keeps the refs as it left
// them (StateDir/refs: at registration, then after every restore) and,
// before anything resolves a ref, puts them back: every ref that differs is
// saved as refs/shim/harness/<gen>/<its name> (replace refs as
// refs/shim/replace/<gen>/<name>) and the trusted value comes back. Shim
// reads the files backend itself (never through a symlink, never waiting
// on a FIFO) and, when anything differs, writes the whole namespace anew:
// one packed-refs, symbolic refs as loose files, nothing else; so no
// planted directory, FIFO, lock or mode can make the write fail.

// HarnessRefPrefix is where Restore keeps the refs an abandoned generation
// created or moved: refs/shim/harness/<gen>/<full ref name>, e.g.
// refs/shim/harness/7/refs/remotes/origin/main. (refs/shim/abandoned/<gen>
// is the snapshot commit itself, so they cannot live below it.)
const HarnessRefPrefix = "refs/shim/harness/"

// trustedRefsName is the trusted ref namespace in StateDir.
const trustedRefsName = "refs"

// refSet maps a full ref name to an object id or to "ref: <target>".
type refSet map[string]string

// RefChange is one ref the abandoned generation created, moved or deleted.
type RefChange = api.RefChange

// refsSupported reports whether the repository keeps its refs in files
// (not reftable), which is what the ref namespace step reads and writes.
func refsSupported(gfd int) bool {
	_, err := lstatAt(gfd, "reftable")
	return isNotExist(err)
}

// repairDirs makes the directories (relative to the git dir) u+rwx, as the
// owner.
func (g *Guard) repairDirs(gfd int, dirs []string) ([]string, error) {
	if len(dirs) == 0 {
		return nil, nil
	}
	sort.Strings(dirs)
	var changed []string
	err := g.ownerDo(func() error {
		p := &repairer{g: g, label: g.gitLabel()}
		for _, d := range dirs {
			pfd, base, err := openParentAt(gfd, d)
			if err != nil {
				continue
			}
			err = p.dirAt(pfd, base, d)
			unix.Close(pfd)
			if err != nil {
				return err
			}
		}
		changed = p.changed
		return nil
	})
	return changed, err
}

// resolve follows symbolic refs in s (at most 5) to an object id, "" when
// the name does not resolve.
func (s refSet) resolve(name string) string {
	for i := 0; i < 6; i++ {
		v, ok := s[name]
		if !ok {
			return ""
		}
		t, sym := strings.CutPrefix(v, "ref: ")
		if !sym {
			return v
		}
		name = t
	}
	return ""
}

// dwim resolves a ref name the way git's rev-parse rules do, among s only:
// the name itself, refs/<name>, refs/tags/, refs/heads/, refs/remotes/ and
// refs/remotes/<name>/HEAD. It reports whether rev is a ref name at all
// (rather than an object id or an expression).
func (s refSet) dwim(rev string) (oid string, isName bool) {
	if isHex(rev) || strings.ContainsAny(rev, "~^:@{}") || rev == "HEAD" {
		return "", false
	}
	for _, n := range []string{rev, "refs/" + rev, "refs/tags/" + rev, "refs/heads/" + rev, "refs/remotes/" + rev, "refs/remotes/" + rev + "/HEAD"} {
		if oid := s.resolve(n); oid != "" {
			return oid, true
		}
	}
	return "", gitformat.ValidRefName("refs/heads/" + strings.TrimPrefix(rev, "refs/"))
}

// loadTrustedRefs reads StateDir/refs; nil when there is none (a state
// registered before gitguard kept one).
func (g *Guard) loadTrustedRefs() (refSet, error) {
	data, err := readFileTrusted(g.stateFile(trustedRefsName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := refSet{}
	for _, line := range strings.Split(string(data), "\n") {
		if v, n, ok := strings.Cut(line, "\t"); ok {
			out[n] = v
		}
	}
	return out, nil
}

// saveTrustedRefs writes StateDir/refs.
func (g *Guard) saveTrustedRefs(s refSet) error {
	names := s.names()
	var b bytes.Buffer
	for _, n := range names {
		fmt.Fprintf(&b, "%s\t%s\n", s[n], n)
	}
	return writeFileAtomic(g.stateFile(trustedRefsName), b.Bytes(), nil)
}

func (s refSet) names() []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// trustRefs records refs shim itself just wrote (the snapshot ref, the
// branch at the baseline) as trusted, so an interrupted restore does not
// take them for the harness's.
func (g *Guard) trustRefs(set map[string]string) error {
	t, err := g.loadTrustedRefs()
	if err != nil {
		return err
	}
	if t == nil {
		if !g.refsKept {
			return nil // no trusted namespace kept (yet)
		}
		t = refSet{}
	}
	for n, v := range set {
		t[n] = v
	}
	return g.saveTrustedRefs(t)
}

// untrustRefs removes refs shim itself deleted (pruned snapshots) from
// the trusted namespace.
func (g *Guard) untrustRefs(names []string) error {
	// Not g.refsKept: that is a restore's, and open (Maintain's too)
	// clears it. The trusted namespace is kept when its file exists.
	if len(names) == 0 {
		return nil
	}
	t, err := g.loadTrustedRefs()
	if err != nil || t == nil {
		return err
	}
	for _, n := range names {
		delete(t, n)
	}
	return g.saveTrustedRefs(t)
}

// refsResult is what the ref namespace step learned about the abandoned
// generation before it put the trusted refs back: the commit its HEAD and
// the pristine branch pointed at.
type refsResult struct {
	head, branch string
}

// restoreRefs is the ref namespace step (see the comment at the top).
func (g *Guard) restoreRefs(gfd int, generation uint64, rep *Report) (*refsResult, error) {
	read, err := g.readRefs(gfd, true)
	if err != nil {
		return nil, fmt.Errorf("read refs: %w", err)
	}
	cur := read.refs
	rep.RefsRemoved = append(rep.RefsRemoved, read.bad...)
	rep.RefsRemovedTruncated = rep.RefsRemovedTruncated || read.badTruncated
	rep.Repaired = append(rep.Repaired, read.repaired...)
	res := &refsResult{branch: cur.resolve(g.pristineBranch())}
	if head, _, err := readFileAt(gfd, "HEAD", 4096); err == nil {
		h := strings.TrimSpace(string(head))
		if t, ok := strings.CutPrefix(h, "ref: "); ok {
			res.head = cur.resolve(t)
		} else if gitformat.IsObjectName(h) {
			res.head = h
		}
	}
	trusted, err := g.loadTrustedRefs()
	if err != nil {
		return nil, fmt.Errorf("read trusted refs: %w", err)
	}
	if trusted == nil {
		// Registered before gitguard kept the refs: they are trusted as
		// they are now, from this restore on.
		g.trusted = cur
		return res, g.saveTrustedRefs(cur)
	}
	next, changes := compareRefs(cur, trusted, generation, rep)
	if len(changes) == 0 {
		g.trusted = trusted
		return res, nil
	}
	dropConflicts(next, trusted, changes)
	for i, c := range changes {
		if i >= maxListed {
			rep.RefsMovedTruncated = true
			break
		}
		rep.RefsMoved = append(rep.RefsMoved, c)
	}
	if err := g.saveTrustedRefs(next); err != nil {
		return nil, fmt.Errorf("save trusted refs: %w", err)
	}
	if err := g.writeRefs(gfd, next); err != nil {
		return nil, fmt.Errorf("write refs: %w", err)
	}
	g.trusted = next
	return res, nil
}

// compareRefs lists what differs between the refs found (cur) and the
// trusted ones, and makes the namespace to write: the trusted refs plus
// the harness's values saved under refs/shim/harness/<gen>/ (at most
// maxSavedRefs of them).
func compareRefs(cur, trusted refSet, generation uint64, rep *Report) (refSet, []RefChange) {
	gen := strconv.FormatUint(generation, 10)
	next := refSet{}
	for n, v := range trusted {
		next[n] = v
	}
	var changes []RefChange
	saved := 0
	for _, n := range cur.names() {
		v := cur[n]
		if trusted[n] == v {
			continue
		}
		c := RefChange{Ref: n, Trusted: trusted[n], Harness: v}
		if saved >= maxSavedRefs {
			rep.RefsNotSaved++ // listed (up to maxListed), not kept
		} else if oid := cur.resolve(n); oid != "" {
			saved++
			if r, ok := strings.CutPrefix(n, "refs/replace/"); ok {
				c.SavedAs = ReplaceRefPrefix + gen + "/" + r
				rep.ReplaceRefsMoved = append(rep.ReplaceRefsMoved, n)
			} else {
				c.SavedAs = HarnessRefPrefix + gen + "/" + n
			}
			if _, taken := next[c.SavedAs]; taken && next[c.SavedAs] != oid {
				c.SavedAs = "" // a trusted ref already has the name: the report keeps the value
			} else {
				next[c.SavedAs] = oid
			}
		}
		changes = append(changes, c)
	}
	for _, n := range trusted.names() {
		if _, ok := cur[n]; !ok {
			changes = append(changes, RefChange{Ref: n, Trusted: trusted[n]})
		}
	}
	return next, changes
}

// dropConflicts removes from next the saved harness refs whose names clash
// with another ref as file and directory (refs/a and refs/a/b cannot both
// exist); their values stay in the report (SavedAs cleared).
func dropConflicts(next, trusted refSet, changes []RefChange) {
	names := next.names()
	clash := map[string]bool{}
	for i, a := range names {
		for _, b := range names[i+1:] {
			if !strings.HasPrefix(b, a) {
				break
			}
			if strings.HasPrefix(b, a+"/") {
				if _, ok := trusted[a]; ok {
					clash[b] = true
				} else {
					clash[a] = true
				}
			}
		}
	}
	for n := range clash {
		delete(next, n)
	}
	for i := range changes {
		if clash[changes[i].SavedAs] {
			changes[i].SavedAs = ""
		}
	}
}

// writeRefs replaces the ref store with s: packed-refs first (atomically;
// loose refs still override it until they are removed), then every loose
// ref goes, then the symbolic refs are written as loose files. A crash at
// any point leaves a store the next restore repairs the same way.
func (g *Guard) writeRefs(gfd int, s refSet) error {
	var packed bytes.Buffer
	packed.WriteString("# pack-refs with: sorted \n")
	var syms []string
	for _, n := range s.names() {
		if strings.HasPrefix(s[n], "ref: ") {
			syms = append(syms, n)
			continue
		}
		fmt.Fprintf(&packed, "%s %s\n", s[n], n)
	}
	if err := writeFileAt(gfd, "packed-refs", packed.Bytes(), 0o644, g.uid, g.gid, nil); err != nil {
		return err
	}
	rfd, err := openDirAt(gfd, "refs")
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	names, err := readDirNames(rfd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAllAt(rfd, n); err != nil {
			return err
		}
	}
	for _, d := range []string{"heads", "tags"} {
		if err := unix.Mkdirat(rfd, d, 0o755); err != nil {
			return &os.PathError{Op: "mkdir", Path: "refs/" + d, Err: err}
		}
		if err := unix.Fchownat(rfd, d, g.uid, g.gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	for _, n := range syms {
		dfd, err := g.mkdirAllAt(gfd, n)
		if err != nil {
			return err
		}
		base := n[strings.LastIndexByte(n, '/')+1:]
		err = writeFileAt(dfd, base, []byte(s[n]+"\n"), 0o644, g.uid, g.gid, nil)
		unix.Close(dfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// saveRefsAsTrusted records the refs as they are now (the end of a
// successful restore) as the trusted namespace.
func (g *Guard) saveRefsAsTrusted(gfd int) error {
	if !g.refsKept {
		return nil
	}
	read, err := g.readRefs(gfd, true)
	if err != nil {
		return err
	}
	return g.saveTrustedRefs(read.refs)
}
