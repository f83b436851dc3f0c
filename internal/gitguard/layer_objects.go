package gitguard

// The harness's own objects in a layer: its loose objects and packs read,
// checked and imported into the lower's store, and the refs it wrote that
// name its commits (the snapshot's parents).

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// importLayerObjects brings the objects the harness wrote (the layer's
// .git/objects: loose objects, each checked against its name, and packs,
// through index-pack, which checks every object) into the repository,
// and returns the commits its refs name (branches, tags, HEAD), the
// current branch's first, and their history as the layer's objects tell
// it (nil when they cannot: then whether it is whole is checked beside
// the import, SnapshotLayer, complete).
//
// Nothing the harness put there fails the fence: what git or shim refuses
// (a pack index-pack rejects, an object that is not what its name says, a
// zlib bomb, a head whose history is not complete) is left out and the
// layer keeps it.
func (g *Guard) importLayerObjects(ctx context.Context, ufd int, base, baseTree string, rep *Report) ([]string, *layerHistory, error) {
	// No .git of the harness's (unchanged), or none that is a directory
	// (removed: a whiteout; replaced by a file, a symlink, a FIFO): no
	// objects or refs of its own to import.
	if st, err := lstatAt(ufd, ".git"); isNotExist(err) || err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, nil, nil
	}
	gfd, err := openDirAt(ufd, ".git")
	if err != nil {
		return nil, nil, nil
	}
	defer unix.Close(gfd)
	budget := int64(maxLayerObjects)
	rejected := func(path string, size int64) {
		if len(rep.NotStored) < maxListed {
			rep.NotStored = append(rep.NotStored, NotStoredFile{Path: path, Type: "pack_rejected", Size: size})
		}
	}
	store, _ := openObjectStore(g.gitDir, len(base))
	if store != nil {
		defer store.close()
	}
	objs := &layerObjects{}
	if ofd, err := openDirAt(gfd, "objects"); err == nil {
		objs, err = g.importObjects(ctx, ofd, store, len(base), &budget, rejected)
		unix.Close(ofd)
		if err != nil {
			return nil, nil, errorf(CodeRestoreFailed, err, "layer snapshot: import the harness's objects")
		}
	}
	ids := layerRefs(gfd, g.gitDir)
	if len(ids) == 0 {
		return nil, nil, nil
	}
	// A ref naming a commit the harness wrote loose (what its git commit
	// leaves) is that commit: checked against its name, imported just
	// now. Any other (a tag, a packed or older commit) is resolved by git.
	res := make([]objInfo, len(ids))
	var queries []string
	for i, id := range ids {
		if objs.types[id] == gitformat.Commit {
			res[i] = objInfo{oid: id, typ: "commit"}
		} else {
			queries = append(queries, id+"^{commit}")
		}
	}
	if len(queries) > 0 {
		looked, err := g.lookup(ctx, queries)
		if err != nil {
			return nil, nil, errorf(CodeRestoreFailed, err, "layer snapshot: the harness's refs")
		}
		for i := range res {
			if res[i].typ == "" {
				res[i], looked = looked[0], looked[1:]
			}
		}
	}
	var heads []string
	seen := map[string]bool{}
	for _, r := range res {
		if r.typ == "commit" && !seen[r.oid] && r.oid != base && len(heads) < maxLayerParents-1 {
			seen[r.oid] = true
			heads = append(heads, r.oid)
		}
	}
	// Their history: read from the layer's objects where they tell it
	// whole, else checked by git beside the import (complete).
	if len(heads) == 0 || store == nil || objs.packs {
		return heads, nil, nil
	}
	trees := g.treesOf(ctx, base, baseTree)
	if trees == nil {
		return heads, nil, nil
	}
	return heads, g.readKnownHistory(heads, base, trees, objs.fresh, store), nil
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

// importObjects brings the loose objects below ofd that hash to their
// names into the repository, as one pack, and feeds each of the layer's
// packs to index-pack. hexLen is the length of the repository's object
// names (40 for SHA-1, 64 for SHA-256). With a store it can read, shim
// writes the pack and its index itself, without the objects the
// repository has (git's copy of a name stands); otherwise index-pack
// reads it (packLoose).
func (g *Guard) importObjects(ctx context.Context, ofd int, store *objectStore, hexLen int, budget *int64, rejected func(path string, size int64)) (*layerObjects, error) {
	names, err := readDirNames(ofd)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var loose []looseObject
	kept := int64(keptLoose)
	for _, d := range names {
		if len(d) == 2 && isHex(d) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			loose = append(loose, verifyLoose(ofd, d, hexLen, budget, &kept)...)
		}
	}
	in := &layerObjects{types: make(map[string]int, len(loose)), fresh: map[string]*looseObject{}}
	if store != nil {
		var fresh []looseObject
		for _, o := range loose {
			if !store.has(o.dir + o.name) {
				fresh = append(fresh, o)
			}
		}
		err = nil
		if len(fresh) > 0 {
			err = store.addPack(ofd, fresh)
		}
		if err == nil {
			for i := range fresh {
				in.fresh[fresh[i].dir+fresh[i].name] = &fresh[i]
			}
		}
	} else {
		err = g.packLoose(ctx, ofd, loose, hexLen)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// As a pack of the harness's that git refuses: listed and left
		// out (its heads are then not whole), never a failed fence.
		var size int64
		for _, o := range loose {
			size += o.size
		}
		rejected(".git/objects ("+strconv.Itoa(len(loose))+" loose objects)", size)
	} else {
		for _, o := range loose {
			in.types[o.dir+o.name] = o.typ
		}
	}
	if err := g.importPacks(ctx, ofd, in, budget, rejected); err != nil {
		return nil, err
	}
	return in, nil
}

// importPacks indexes the layer's packs (objects/pack, in the directory
// open at ofd) into the repository with git index-pack, within budget:
// one it has already is skipped, one git refuses is listed as rejected
// and left out (the harness's data, never a reason to fail the fence; the
// layer keeps it). Only the context's end is an error.
func (g *Guard) importPacks(ctx context.Context, ofd int, in *layerObjects, budget *int64, rejected func(path string, size int64)) error {
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
		fd, err := unix.Openat(pfd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), n)
		if g.havePack(n, st.Size, f) {
			f.Close()
			continue
		}
		*budget -= st.Size
		in.packs = true
		_, err = g.git(ctx, gitOpts{stdin: f}, "index-pack", "--stdin", "--fix-thin")
		f.Close()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			rejected(".git/objects/pack/"+n, st.Size)
		}
	}
	return nil
}

// havePack reports whether the repository has the pack f (named name,
// of size bytes) already: a pack of that name and size whose trailing
// checksum (of all its bytes) is f's. A harness's git copies a pack of
// the lower's up into its layer whenever it freshens an object in it
// (git touches the pack's mtime when it writes an object the pack has):
// a copy that index-pack would read whole, 5,000 objects at 5,000 files,
// to import nothing. A file that only claims the name fails index-pack
// anyway (its checksum is not its bytes').
//
//shimlint:allow atpaths: layers mode: the git dir is the locked lower, which no harness writes
func (g *Guard) havePack(name string, size int64, f *os.File) bool {
	const tail = 64 // the longest checksum (SHA-256), or the SHA-1 one and what precedes it
	if size < 12+tail {
		return false
	}
	mine, err := os.Open(filepath.Join(g.gitDir, "objects", "pack", name))
	if err != nil {
		return false
	}
	defer mine.Close()
	if st, err := mine.Stat(); err != nil || !st.Mode().IsRegular() || st.Size() != size {
		return false
	}
	a, b := make([]byte, tail), make([]byte, tail)
	if _, err := f.ReadAt(a, size-tail); err != nil {
		return false
	}
	if _, err := mine.ReadAt(b, size-tail); err != nil {
		return false
	}
	return bytes.Equal(a, b)
}
