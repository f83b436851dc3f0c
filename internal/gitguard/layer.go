package gitguard

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Layer limits: what one abandoned generation's layer can make the fence
// read. A file over Config.MaxFileSize is listed in NotStored (path, type,
// size, the hash of its first MiB), never read in full; the harness's own
// objects are imported up to maxLayerObjects bytes in all.
const (
	maxLayerObjects = 1 << 30
	maxLooseObject  = 64 << 20 // a loose object's claimed or compressed size
	hashedPrefix    = 1 << 20
	maxLayerParents = 64
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

// SnapshotLayer makes the worktree layer upper of an abandoned generation
// (an overlay's upper directory, the lower being the worktree at baseline,
// .git included) the commit refs/shim/abandoned/<generation>: the
// baseline's tree with the layer's files, whiteouts as deletions, opaque
// directories replacing the baseline's, the harness's own commits (their
// objects verified on import) as parents. Nothing in the worktree is read
// or written but the repository's objects and the ref: the lower is at the
// baseline by construction. A layer whose snapshot exists already (a
// retried fence) is not imported again.
func (g *Guard) SnapshotLayer(ctx context.Context, generation uint64, baseline, upper string) (*Report, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	start := time.Now()
	rep := &Report{Worktree: g.wt, BaselineRev: baseline, Isolation: "layers", MaxFileSize: g.maxFile, DurationsMS: map[string]float64{}}
	if err := validRev(baseline); err != nil {
		return rep, err
	}
	if err := g.open(true); err != nil {
		return rep, err
	}
	ref := RefPrefix + strconv.FormatUint(generation, 10)
	rep.SnapshotRef = ref
	res, err := g.lookup(ctx, []string{baseline + "^{commit}", baseline + "^{tree}", ref, "HEAD"})
	if err != nil {
		return rep, errorf(CodeRestoreFailed, err, "layer snapshot: resolve the baseline")
	}
	if res[0].typ != "commit" {
		return rep, errorf(CodeRestoreFailed, nil, "layer snapshot: baseline %q is not a commit in %s", baseline, g.wt)
	}
	base, baseTree := res[0].oid, res[1].oid
	rep.Baseline, rep.HeadBefore = base, base
	// The layer's own snapshot exists when an earlier attempt of this
	// fence made it (its marker, in shim's layer dir, names it). A ref of
	// that name that is not this layer's (a previous shim's generation of
	// the same number) is kept as a parent, never taken for this one.
	marker := filepath.Join(filepath.Dir(upper), "snapshot")
	mine, _ := os.ReadFile(marker)
	var older string
	switch {
	case res[2].typ == "commit" && strings.TrimSpace(string(mine)) == res[2].oid:
		rep.SnapshotCommit, rep.SnapshotReused = res[2].oid, true
	case res[2].typ == "commit":
		older = res[2].oid
		fallthrough
	default:
		ufd, err := openDir(upper)
		if err != nil {
			return rep, errorf(CodeRestoreFailed, err, "layer snapshot: open the layer")
		}
		defer unix.Close(ufd)
		heads, err := g.importLayerObjects(ctx, ufd, base, rep)
		if err != nil {
			return rep, err
		}
		parents := []string{base}
		for _, h := range heads {
			if h != base && len(parents) < maxLayerParents {
				parents = append(parents, h)
			}
		}
		if len(parents) > 1 {
			parents = parents[1:] // the harness's head first, as the scan's snapshot has it
			rep.HeadBefore = parents[0]
		}
		if older != "" {
			parents = append(parents, older)
		}
		msg := snapshotMessage(generation, g.wt, base, rep.HeadBefore)
		if rep.SnapshotCommit, err = g.importLayer(ctx, ufd, parents, baseTree, msg, ref, rep); err != nil {
			g.removeImportLeftovers()
			return rep, errorf(CodeRestoreFailed, err, "layer snapshot: fast-import")
		}
		if err := os.WriteFile(marker, []byte(rep.SnapshotCommit+"\n"), 0o600); err != nil {
			return rep, errorf(CodeRestoreFailed, err, "layer snapshot: mark the layer saved")
		}
		// shim wrote it: a scan restore after this one (a moved baseline,
		// a push check) must not take it for the harness's
		if err := g.trustRefs(map[string]string{ref: rep.SnapshotCommit}); err != nil {
			return rep, errorf(CodeRestoreFailed, err, "layer snapshot: record the snapshot ref")
		}
	}
	rep.DurationsMS["snapshot"] = ms(time.Since(start))
	if err := g.describeLayer(ctx, base, baseTree, rep); err != nil {
		return rep, errorf(CodeRestoreFailed, err, "layer snapshot: describe")
	}
	rep.DurationsMS["total"] = ms(time.Since(start))
	return rep, nil
}

// removeImportLeftovers removes what a fast-import that failed (a full
// disk) leaves: its crash report and its temporary pack, which would only
// take more of the room it lacked.
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
func (g *Guard) describeLayer(ctx context.Context, base, baseTree string, rep *Report) error {
	noIndex := filepath.Join(g.gitDir, "shim-no-index")
	if err := os.Remove(noIndex); err != nil && !os.IsNotExist(err) { // left by a harness in a scan-mode generation
		return err
	}
	return parallel(
		func() error {
			out, err := g.git(ctx, gitOpts{index: noIndex}, "diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-abbrev", baseTree, rep.SnapshotCommit)
			if err != nil {
				return err
			}
			fillChanges(out, &rep.Paths, &rep.PathsTruncated, &rep.Modified, &rep.Added, &rep.Deleted, &rep.NestedRepos)
			return nil
		},
		func() error {
			if rep.HeadBefore == base {
				return nil
			}
			out, err := g.git(ctx, gitOpts{index: noIndex}, "rev-list", "--count", rep.SnapshotCommit+"^@", "--not", base)
			if err != nil {
				return err
			}
			rep.LocalCommits, err = strconv.Atoi(strings.TrimSpace(string(out)))
			return err
		},
	)
}

// importLayer streams the layer into one fast-import.
func (g *Guard) importLayer(ctx context.Context, ufd int, parents []string, baseTree, msg, ref string, rep *Report) (string, error) {
	pr, pw := io.Pipe()
	go func() {
		bw := bufio.NewWriterSize(pw, 1<<16)
		fmt.Fprintf(bw, "commit %s\nmark :1\ncommitter shim <shim@localhost> %d +0000\ndata %d\n%s\nfrom %s\n",
			ref, time.Now().Unix(), len(msg), msg, parents[0])
		for _, p := range parents[1:] {
			fmt.Fprintf(bw, "merge %s\n", p)
		}
		fmt.Fprintf(bw, "M 040000 %s \"\"\n", baseTree)
		w := &layerWalk{w: bw, rep: rep, max: g.maxFile}
		err := w.dir(ufd, "")
		if err == nil {
			_, err = bw.WriteString("\nget-mark :1\ndone\n")
		}
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err)
	}()
	out, err := g.git(ctx, gitOpts{stdin: pr, config: []string{"fastimport.unpackLimit=0"}},
		"fast-import", "--quiet", "--done", "--date-format=raw")
	pr.CloseWithError(errors.New("fast-import ended"))
	if err != nil {
		return "", err
	}
	commit := strings.TrimSpace(string(out))
	if !isHex(commit) {
		return "", fmt.Errorf("fast-import answered %q", commit)
	}
	return commit, nil
}

// layerWalk writes fast-import file commands for a layer's tree.
type layerWalk struct {
	w   *bufio.Writer
	rep *Report
	max int64
}

// notStored lists a file of the layer the snapshot does not store (the
// scan's NotStored, with the same types).
func (l *layerWalk) notStored(f NotStoredFile) {
	if len(l.rep.NotStored) >= maxListed {
		return
	}
	l.rep.NotStored = append(l.rep.NotStored, f)
}

// dir walks the directory open at fd (rel is its path in the worktree,
// "" for the top). An opaque directory (the harness removed the
// baseline's and made a new one) first deletes the baseline's.
func (l *layerWalk) dir(fd int, rel string) error {
	if rel != "" {
		var v [8]byte
		if n, err := unix.Fgetxattr(fd, "trusted.overlay.opaque", v[:]); err == nil && n == 1 && v[0] == 'y' {
			fmt.Fprintf(l.w, "D %s\n", quotePath(rel))
		}
	}
	names, err := readDirNames(fd)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, n := range names {
		p := n
		if rel != "" {
			p = rel + "/" + n
		}
		if rel == "" && n == ".git" {
			continue // the repository: its objects and refs are imported apart
		}
		if strings.EqualFold(n, ".git") {
			l.notStored(NotStoredFile{Path: p, Type: "nested_git"})
			continue
		}
		if err := l.entry(fd, n, p); err != nil {
			return err
		}
	}
	return nil
}

func (l *layerWalk) entry(fd int, name, p string) error {
	st, err := lstatAt(fd, name)
	if err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		cfd, err := openDirAt(fd, name)
		if err != nil {
			return err
		}
		defer unix.Close(cfd)
		return l.dir(cfd, p)
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			_, err := fmt.Fprintf(l.w, "D %s\n", quotePath(p)) // a whiteout: deleted
			return err
		}
		l.notStored(NotStoredFile{Path: p, Type: "char_device"})
	case unix.S_IFBLK:
		l.notStored(NotStoredFile{Path: p, Type: "block_device"})
	case unix.S_IFIFO:
		l.notStored(NotStoredFile{Path: p, Type: "fifo"})
	case unix.S_IFSOCK:
		l.notStored(NotStoredFile{Path: p, Type: "socket"})
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(fd, name, buf)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(l.w, "M 120000 inline %s\ndata %d\n%s\n", quotePath(p), n, buf[:n])
		return err
	case unix.S_IFREG:
		return l.file(fd, name, p, st)
	}
	return nil
}

func (l *layerWalk) file(dfd int, name, p string, st unix.Stat_t) error {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if st.Size > l.max {
		h := sha256.New()
		n, _ := io.CopyN(h, f, hashedPrefix)
		l.notStored(NotStoredFile{Path: p, Type: "file", Size: st.Size, Allocated: st.Blocks * 512,
			Hash: "sha256:" + hex.EncodeToString(h.Sum(nil)), HashedBytes: n})
		return nil
	}
	mode := "100644"
	if st.Mode&0o100 != 0 {
		mode = "100755"
	}
	fmt.Fprintf(l.w, "M %s inline %s\ndata %d\n", mode, quotePath(p), st.Size)
	n, err := io.CopyN(l.w, f, st.Size)
	if err != nil {
		return fmt.Errorf("read %s: %d of %d bytes: %w", p, n, st.Size, err)
	}
	return l.w.WriteByte('\n')
}

// importLayerObjects brings the objects the harness wrote (the layer's
// .git/objects: loose objects, each checked against its name, and packs,
// through index-pack, which checks every object) into the repository,
// and returns the commits its refs name (branches, tags, HEAD), the
// current branch's first.
//
// Nothing the harness put there fails the fence: what git or shim refuses
// (a pack index-pack rejects, an object that is not what its name says, a
// zlib bomb, a head whose history is not complete) is left out and the
// layer keeps it.
func (g *Guard) importLayerObjects(ctx context.Context, ufd int, base string, rep *Report) ([]string, error) {
	// No .git of the harness's (unchanged), or none that is a directory
	// (removed: a whiteout; replaced by a file, a symlink, a FIFO): no
	// objects or refs of its own to import.
	if st, err := lstatAt(ufd, ".git"); isNotExist(err) || err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, nil
	}
	gfd, err := openDirAt(ufd, ".git")
	if err != nil {
		return nil, nil
	}
	defer unix.Close(gfd)
	budget := int64(maxLayerObjects)
	rejected := func(path string, size int64) {
		if len(rep.NotStored) < maxListed {
			rep.NotStored = append(rep.NotStored, NotStoredFile{Path: path, Type: "pack_rejected", Size: size})
		}
	}
	if ofd, err := openDirAt(gfd, "objects"); err == nil {
		err = g.importObjects(ctx, ofd, &budget, rejected)
		unix.Close(ofd)
		if err != nil {
			return nil, errorf(CodeRestoreFailed, err, "layer snapshot: import the harness's objects")
		}
	}
	ids := layerRefs(gfd, g.gitDir)
	if len(ids) == 0 {
		return nil, nil
	}
	queries := make([]string, len(ids))
	for i, id := range ids {
		queries[i] = id + "^{commit}"
	}
	res, err := g.lookup(ctx, queries)
	if err != nil {
		return nil, errorf(CodeRestoreFailed, err, "layer snapshot: the harness's refs")
	}
	var heads []string
	seen := map[string]bool{}
	for _, r := range res {
		if r.typ == "commit" && !seen[r.oid] && r.oid != base && len(heads) < maxLayerParents {
			seen[r.oid] = true
			heads = append(heads, r.oid)
		}
	}
	return g.complete(ctx, heads, base), nil
}

// complete keeps the heads whose history, down to base, has every object
// in the repository: a commit whose parent is missing would make the
// snapshot a history git cannot walk (log, gc, clone all fail).
func (g *Guard) complete(ctx context.Context, heads []string, base string) []string {
	check := func(hs ...string) bool {
		args := append(append([]string{"rev-list", "--objects", "--quiet"}, hs...), "--not", base)
		_, err := g.git(ctx, gitOpts{index: filepath.Join(g.gitDir, "shim-no-index"), quiet: true}, args...)
		return err == nil
	}
	if len(heads) == 0 || check(heads...) {
		return heads
	}
	var ok []string
	for _, h := range heads {
		if check(h) {
			ok = append(ok, h)
		}
	}
	return ok
}

// layerRefs reads the object ids the layer's refs hold, as text (no git
// runs on the harness's files): the branch HEAD names (or a detached
// HEAD) first, then loose refs under refs/, then packed-refs. HEAD and its
// branch are read as the harness's repository had them: from the layer,
// else (unchanged) from the lower, the trusted git dir.
func layerRefs(gfd int, lowerGitDir string) []string {
	var ids []string
	add := func(b []byte) {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && isHex(f[0]) && (len(f[0]) == 40 || len(f[0]) == 64) {
				ids = append(ids, f[0])
			}
		}
	}
	lfd, lerr := openDir(lowerGitDir)
	if lerr == nil {
		defer unix.Close(lfd)
	}
	head, _, err := readFileAt(gfd, "HEAD", 4096)
	if isNotExist(err) && lerr == nil {
		head, _, err = readFileAt(lfd, "HEAD", 4096)
	}
	if err == nil {
		s := strings.TrimSpace(string(head))
		if name, ok := strings.CutPrefix(s, "ref: "); ok {
			if id := branchID(gfd, name); id != "" {
				ids = append(ids, id)
			} else if lerr == nil {
				if id := branchID(lfd, name); id != "" {
					ids = append(ids, id)
				}
			}
		} else {
			add(head)
		}
	}
	var walk func(fd int, depth int)
	walk = func(fd int, depth int) {
		names, _ := readDirNames(fd)
		sort.Strings(names)
		for _, n := range names {
			st, err := lstatAt(fd, n)
			if err != nil {
				continue
			}
			switch {
			case st.Mode&unix.S_IFMT == unix.S_IFDIR && depth < 16:
				if c, err := openDirAt(fd, n); err == nil {
					walk(c, depth+1)
					unix.Close(c)
				}
			case st.Mode&unix.S_IFMT == unix.S_IFREG:
				if b, _, err := readFileAt(fd, n, 4096); err == nil {
					add(b)
				}
			}
		}
	}
	if rfd, err := openDirAt(gfd, "refs"); err == nil {
		walk(rfd, 0)
		unix.Close(rfd)
	}
	if b, _, err := readFileAt(gfd, "packed-refs", 16<<20); err == nil {
		add(b)
	}
	return ids
}

// branchID is the object id of ref name (refs/...) in the git dir open at
// gfd: its loose file, else its line of packed-refs; "" when neither has
// it. Every component is opened without following a symlink.
func branchID(gfd int, name string) string {
	parts := strings.Split(name, "/")
	if len(parts) < 2 || parts[0] != "refs" || len(parts) > 16 {
		return ""
	}
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return ""
		}
	}
	fd, err := unix.Dup(gfd)
	if err != nil {
		return ""
	}
	for _, p := range parts[:len(parts)-1] {
		c, err := openDirAt(fd, p)
		unix.Close(fd)
		if err != nil {
			fd = -1
			break
		}
		fd = c
	}
	if fd >= 0 {
		b, _, err := readFileAt(fd, parts[len(parts)-1], 4096)
		unix.Close(fd)
		if f := strings.Fields(string(b)); err == nil && len(f) > 0 && isHex(f[0]) && (len(f[0]) == 40 || len(f[0]) == 64) {
			return f[0]
		}
	}
	b, _, err := readFileAt(gfd, "packed-refs", 16<<20)
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[1] == name && isHex(f[0]) && (len(f[0]) == 40 || len(f[0]) == 64) {
			return f[0]
		}
	}
	return ""
}

// importObjects copies the loose objects below ofd that hash to their
// names into the repository, and feeds each pack to index-pack.
func (g *Guard) importObjects(ctx context.Context, ofd int, budget *int64, rejected func(path string, size int64)) error {
	names, err := readDirNames(ofd)
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, d := range names {
		if len(d) == 2 && isHex(d) {
			if err := g.importLoose(ctx, ofd, d, budget); err != nil {
				return err
			}
		}
	}
	pfd, err := openDirAt(ofd, "pack")
	if err != nil {
		return nil
	}
	defer unix.Close(pfd)
	packs, _ := readDirNames(pfd)
	sort.Strings(packs)
	for _, n := range packs {
		if !strings.HasSuffix(n, ".pack") {
			continue
		}
		st, err := lstatAt(pfd, n)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > *budget {
			continue
		}
		*budget -= st.Size
		fd, err := unix.Openat(pfd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), n)
		_, err = g.git(ctx, gitOpts{stdin: f}, "index-pack", "--stdin", "--fix-thin")
		f.Close()
		if err != nil {
			// The harness's data, not shim's: a pack git refuses is
			// listed and left out, never a reason to fail the fence (the
			// layer keeps it).
			if ctx.Err() != nil {
				return ctx.Err()
			}
			rejected(".git/objects/pack/"+n, st.Size)
		}
	}
	return nil
}

// importLoose copies the loose objects of one fan-out directory. Each is
// inflated as a stream into its hash, its header read first: an object
// whose header claims more than maxLooseObject bytes, or that inflates to
// more than it claims, is not imported, and the inflated bytes count
// against the budget (a zlib bomb costs the budget, not shim's memory).
func (g *Guard) importLoose(ctx context.Context, ofd int, d string, budget *int64) error {
	dfd, err := openDirAt(ofd, d)
	if err != nil {
		return nil
	}
	defer unix.Close(dfd)
	names, _ := readDirNames(dfd)
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !isHex(n) || (len(n) != 38 && len(n) != 62) || *budget <= 0 {
			continue
		}
		dst := filepath.Join(g.gitDir, "objects", d, n)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		b, st, err := readFileAt(dfd, n, min(*budget, maxLooseObject))
		if err != nil || st.Size > *budget || st.Size > maxLooseObject {
			continue
		}
		*budget -= st.Size
		ok, inflated := looseMatches(b, d+n, *budget)
		*budget -= inflated
		if !ok {
			continue // not the object its name says: not imported
		}
		// Written as the repository's owner would have: the harness of
		// the next generation adds its own objects to the same fan-out
		// directory (a root-owned one refused its first commit).
		dir := filepath.Dir(dst)
		if _, err := os.Lstat(dir); os.IsNotExist(err) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
			if err := os.Lchown(dir, g.uid, g.gid); err != nil {
				return err
			}
		}
		tmp := dst + ".shim-tmp"
		if err := os.WriteFile(tmp, b, 0o444); err != nil {
			return err
		}
		if err := os.Lchown(tmp, g.uid, g.gid); err != nil {
			return err
		}
		if err := os.Rename(tmp, dst); err != nil {
			return err
		}
	}
	return nil
}

// looseMatches reports whether b, a zlib-compressed loose object, has a
// valid header for at most maxLooseObject bytes, inflates to exactly
// that and hashes to id (SHA-1 or SHA-256 by its length), reading at most
// budget inflated bytes; it returns how many it inflated.
func looseMatches(b []byte, id string, budget int64) (bool, int64) {
	zr, err := zlib.NewReader(bytes.NewReader(b))
	if err != nil {
		return false, 0
	}
	defer zr.Close()
	br := bufio.NewReaderSize(zr, 64)
	hdr, err := br.ReadString(0)
	if err != nil || len(hdr) > 32 {
		return false, int64(len(hdr))
	}
	f := strings.Fields(strings.TrimSuffix(hdr, "\x00"))
	if len(f) != 2 {
		return false, int64(len(hdr))
	}
	switch f[0] {
	case "blob", "tree", "commit", "tag":
	default:
		return false, int64(len(hdr))
	}
	size, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || size < 0 || size > maxLooseObject || size > budget {
		return false, int64(len(hdr))
	}
	var h hash.Hash = sha1.New()
	if len(id) == 64 {
		h = sha256.New()
	}
	h.Write([]byte(hdr))
	n, err := io.Copy(h, io.LimitReader(br, size+1))
	if err != nil || n != size {
		return false, int64(len(hdr)) + n
	}
	return hex.EncodeToString(h.Sum(nil)) == id, int64(len(hdr)) + n
}
