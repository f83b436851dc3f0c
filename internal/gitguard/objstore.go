package gitguard

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// An objectStore answers whether the trusted git dir has an object, from
// the names of its loose objects and its packs' indexes, read by shim: a
// git per question costs a fence milliseconds (far more in a container),
// and a layer snapshot asks about every object of the harness's commits.
// It answers only for a store it can read whole (see openObjectStore).
// What it reads is read by gitformat; where it is, and how it is opened
// (never through a link), is the store's.
type objectStore struct {
	ofd    int // the git dir's objects directory
	hexLen int
	packs  gitformat.Packs
	// fanout: the loose objects' directories there are (objects/xx),
	// each with the names in it once read: a directory listing per
	// directory asked about, not a stat per object (on a FUSE root, a
	// container's, each costs a round trip to the daemon; and a repository
	// shim keeps seldom has loose objects at all).
	fanout map[string]map[string]bool
	// budget, when positive, bounds the bytes read inflates (deltas and
	// their bases too): past it a read fails (gitformat.ErrUnreadable).
	budget gitformat.Budget
	// files: the packs' and indexes' files open, closed with the store.
	files []*os.File
}

// maxStorePacks bounds the packs a store reads itself: each index's file
// stays open while the store is (read with pread, never mapped), and
// PID 1's open files must not grow with a repository whose maintenance
// kept failing. Maintenance rolls packs up at maintainMaxPacks.
const maxStorePacks = 256

// openObjectStore opens the objects directory of gitDir for has. ok is
// false when it cannot answer alone: objects borrowed from elsewhere
// (alternates), a pack index it does not read (another version, or
// truncated), or more than maxStorePacks packs; git answers then.
func openObjectStore(gitDir string, hexLen int) (s *objectStore, ok bool) {
	ofd, err := openDir(gitDir + "/objects")
	if err != nil {
		return nil, false
	}
	s = &objectStore{ofd: ofd, hexLen: hexLen, fanout: map[string]map[string]bool{}}
	s.packs = gitformat.Packs{HashLen: hexLen / 2, Budget: &s.budget, Open: s.openPack}
	if _, err := lstatAt(ofd, "info/alternates"); !isNotExist(err) {
		s.close()
		return nil, false
	}
	top, err := readDirNames(ofd)
	if err != nil {
		s.close()
		return nil, false
	}
	for _, d := range top {
		if len(d) == 2 && isHex(d) {
			s.fanout[d] = nil // not read yet
		}
	}
	pfd, err := openDirAt(ofd, "pack")
	if isNotExist(err) {
		return s, true
	}
	if err != nil {
		s.close()
		return nil, false
	}
	defer unix.Close(pfd)
	names, err := readDirNames(pfd)
	if err != nil {
		s.close()
		return nil, false
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "pack-") || !strings.HasSuffix(n, ".idx") {
			continue
		}
		if len(s.files) == maxStorePacks {
			s.close() // git answers for a store of more packs
			return nil, false
		}
		x, f, err := openIndex(pfd, n, hexLen/2)
		if err != nil {
			s.close()
			return nil, false
		}
		s.files = append(s.files, f)
		s.packs.List = append(s.packs.List, gitformat.Pack{Name: strings.TrimSuffix(n, ".idx"), Index: x})
	}
	return s, true
}

// openIndex opens the version 2 pack index name (in the directory open
// at pfd), to be read where it is, and checks that its size is its object
// count's. The file is the caller's to close.
func openIndex(pfd int, name string, hashLen int) (*gitformat.Index, *os.File, error) {
	f, size, err := openFileAt(pfd, name)
	if err != nil {
		return nil, nil, err
	}
	x, err := gitformat.ReadIndex(f, size, hashLen)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	return x, f, nil
}

// openFileAt opens name (in the directory open at dfd, never through a
// link) read-only, a regular file (openRegularAt), and its size. Packs and
// indexes are read with pread, never mapped: a mapping's pages count in
// PID 1's RSS.
func openFileAt(dfd int, name string) (*os.File, int64, error) {
	f, err := openRegularAt(dfd, name)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}

// has reports whether the store has object id (a full name of the
// store's length): a loose object's file, or a pack's index entry.
func (s *objectStore) has(id string) bool {
	if len(id) != s.hexLen {
		return false
	}
	return s.hasLoose(id) || s.hasPacked(id)
}

// hasPacked reports whether a pack of the store has id.
func (s *objectStore) hasPacked(id string) bool {
	raw, err := hex.DecodeString(id)
	if err != nil || len(id) != s.hexLen {
		return false
	}
	_, _, ok := s.packs.Find(raw)
	return ok
}

// hasLoose reports whether the store has id as a loose object.
func (s *objectStore) hasLoose(id string) bool {
	names, ok := s.fanout[id[:2]]
	if !ok {
		return false
	}
	if names == nil {
		names = map[string]bool{}
		if dfd, err := openDirAt(s.ofd, id[:2]); err == nil {
			ns, _ := readDirNames(dfd)
			unix.Close(dfd)
			for _, n := range ns {
				names[n] = true
			}
		}
		s.fanout[id[:2]] = names
	}
	return names[id[2:]]
}

// typeOf is the type of object id in the store (gitformat.Commit, Tree,
// Blob, Tag), 0 when the store does not have it or cannot tell: a loose
// object's header, or a pack entry's, a delta's that of its base (nothing
// is inflated but a loose object's header).
func (s *objectStore) typeOf(id string) int {
	if len(id) != s.hexLen {
		return 0
	}
	raw, err := hex.DecodeString(id)
	if err != nil {
		return 0
	}
	if i, at, ok := s.packs.Find(raw); ok {
		return s.packs.Type(i, at)
	}
	if !s.hasLoose(id) {
		return 0
	}
	b, err := s.looseFile(id)
	if err != nil {
		return 0
	}
	return gitformat.LooseType(b)
}

// looseFile is the bytes of loose object id's file (at most
// maxLooseObject).
func (s *objectStore) looseFile(id string) ([]byte, error) {
	dfd, err := openDirAt(s.ofd, id[:2])
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	b, _, err := readFileAt(dfd, id[2:], maxLooseObject)
	return b, err
}

// read returns the type and bytes of object id (a full name), at most
// max bytes (its delta bases too), within the store's budget: from a
// pack's entry, deltas applied, or a loose object's file, checked against
// its name (a pack's are the store's own, checked when git or shim wrote
// them).
func (s *objectStore) read(id string, max int64) (int, []byte, error) {
	raw, err := hex.DecodeString(id)
	if err != nil || len(id) != s.hexLen {
		return 0, nil, fmt.Errorf("%w: %q is not an object name", gitformat.ErrUnreadable, id)
	}
	if i, at, ok := s.packs.Find(raw); ok {
		return s.packs.Read(i, at, max)
	}
	if !s.hasLoose(id) {
		return 0, nil, fmt.Errorf("%w: %s: missing", gitformat.ErrUnreadable, id)
	}
	b, err := s.looseFile(id)
	if err != nil {
		return 0, nil, err
	}
	return gitformat.ParseLoose(id, b, max, &s.budget)
}

// openPack opens pack p (read only).
func (s *objectStore) openPack(p *gitformat.Pack) bool {
	f, size, err := openFileAt(s.ofd, "pack/"+p.Name+".pack")
	if err != nil {
		return false
	}
	if size < 12 {
		f.Close()
		return false
	}
	s.files = append(s.files, f)
	p.File, p.Size = f, size
	return true
}

func (s *objectStore) close() {
	for _, f := range s.files {
		f.Close()
	}
	s.files, s.packs.List = nil, nil
	unix.Close(s.ofd)
}

// addPack writes objs (read again from the layer, below lfd, where their
// bytes were not kept) into the store as one pack and its index, the
// files git's index-pack would write (see newPack).
func (s *objectStore) addPack(lfd int, objs []looseObject) error {
	np, err := s.newPack("")
	if err != nil {
		return err
	}
	entries, sum, err := writePack(np.f, lfd, objs, s.hexLen)
	if err != nil {
		np.abandon()
		return err
	}
	return np.install(entries, sum)
}

// A newPack is a pack on its way into the store: a temporary file in
// objects/pack, written, then installed with its index (each synced,
// then renamed, the index last: git sees a pack only by its index), or
// abandoned. They are shim's, read-only: sealed (see SealPacks).
type newPack struct {
	pfd    int
	tmp    string // the temporary files' name, without .pack or .idx
	f      *os.File
	hexLen int
}

// newPack creates the temporary file of a new pack (kind tells apart two
// of one shim), making objects/pack where it is missing.
func (s *objectStore) newPack(kind string) (*newPack, error) {
	pfd, err := openDirAt(s.ofd, "pack")
	if isNotExist(err) {
		// git makes it with every repository; as the owner's, so that
		// the owner's git can still add and remove packs in it
		var st unix.Stat_t
		if err = unix.Fstat(s.ofd, &st); err == nil {
			err = unix.Mkdirat(s.ofd, "pack", 0o755)
		}
		if err == nil && os.Geteuid() == 0 {
			err = unix.Fchownat(s.ofd, "pack", int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
		}
		if err == nil {
			pfd, err = openDirAt(s.ofd, "pack")
		}
	}
	if err != nil {
		return nil, err
	}
	np := &newPack{pfd: pfd, tmp: "tmp_pack_shim_" + strconv.Itoa(os.Getpid()) + kind, hexLen: s.hexLen}
	np.f, err = np.create(".pack")
	if err != nil {
		unix.Close(pfd)
		return nil, err
	}
	return np, nil
}

// create makes the temporary file of suffix, empty (a leftover of a
// fence that stopped here removed first).
func (np *newPack) create(suffix string) (*os.File, error) {
	name := np.tmp + suffix
	unix.Unlinkat(np.pfd, name, 0)
	fd, err := unix.Openat(np.pfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// abandon removes the temporary files.
func (np *newPack) abandon() {
	np.f.Close()
	unix.Unlinkat(np.pfd, np.tmp+".pack", 0)
	unix.Unlinkat(np.pfd, np.tmp+".idx", 0)
	unix.Close(np.pfd)
}

// install writes the index of the pack written (its entries and
// checksum), syncs both at once, renames them to the pack's name, the
// index last, and syncs the directory: one batch of syncs for the pack.
func (np *newPack) install(entries []gitformat.IndexEntry, sum []byte) error {
	err := parallel(np.f.Sync, func() error {
		idx, err := np.create(".idx")
		if err != nil {
			return err
		}
		err = gitformat.WriteIndex(idx, entries, sum, np.hexLen)
		if err == nil {
			err = idx.Sync()
		}
		if cerr := idx.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		np.abandon()
		return err
	}
	defer unix.Close(np.pfd)
	if err := np.f.Close(); err != nil {
		unix.Unlinkat(np.pfd, np.tmp+".pack", 0)
		unix.Unlinkat(np.pfd, np.tmp+".idx", 0)
		return err
	}
	name := "pack-" + hex.EncodeToString(sum)
	if err := unix.Renameat(np.pfd, np.tmp+".pack", np.pfd, name+".pack"); err != nil {
		unix.Unlinkat(np.pfd, np.tmp+".idx", 0)
		return err
	}
	if err := unix.Renameat(np.pfd, np.tmp+".idx", np.pfd, name+".idx"); err != nil {
		return err
	}
	return unix.Fsync(np.pfd)
}

// writePack writes a version 2 pack of objs (each whole, none a delta;
// those whose bytes were not kept are read again from the layer, below
// lfd, as a stream, never held whole, and hashed again: the pack holds
// the bytes that had the name, or nothing) to w, and returns where it put
// each and the pack's checksum.
func writePack(w io.Writer, lfd int, objs []looseObject, hexLen int) ([]gitformat.IndexEntry, []byte, error) {
	pw := gitformat.NewPackWriter(w, len(objs), hexLen)
	for _, o := range objs {
		id, _ := hex.DecodeString(o.dir + o.name)
		var body io.Reader = bytes.NewReader(o.data)
		var check hash.Hash
		var f *os.File // a loose file read again, closed once its bytes are in the pack
		if o.data == nil && o.size > 0 {
			hdr, r, lf, err := reopenLoose(lfd, o)
			if err != nil {
				return nil, nil, err
			}
			f = lf
			check = gitformat.NewHash(hexLen)
			check.Write([]byte(hdr))
			body = io.TeeReader(r, check)
		}
		err := pw.Add(id, o.typ, o.size, body)
		if f != nil {
			f.Close()
		}
		if err != nil {
			return nil, nil, fmt.Errorf("object %s%s: %v", o.dir, o.name, err)
		}
		if check != nil && hex.EncodeToString(check.Sum(nil)) != o.dir+o.name {
			return nil, nil, fmt.Errorf("object %s%s changed since it was checked", o.dir, o.name)
		}
	}
	return pw.Close()
}

// reopenLoose opens loose object o again in the layer below lfd, to be
// read as a stream (gitformat.OpenLoose): its header (checked before, by
// VerifyLoose), its body, and its file, to close once the body is read.
func reopenLoose(lfd int, o looseObject) (string, io.Reader, *os.File, error) {
	dfd, err := openDirAt(lfd, o.dir)
	if err != nil {
		return "", nil, nil, err
	}
	f, err := openRegularAt(dfd, o.name)
	unix.Close(dfd)
	if err != nil {
		return "", nil, nil, err
	}
	hdr, body, err := gitformat.OpenLoose(bufio.NewReaderSize(io.LimitReader(f, maxLooseObject), 32<<10))
	if err != nil {
		f.Close()
		return "", nil, nil, err
	}
	return hdr, body, f, nil
}

// SealPacks makes every pack file of the repository root's and not
// writable (it changes only files that are not), so that a harness that
// owns the repository cannot touch them: git freshens a pack whose object
// it writes again by setting the pack's times, which on a layer's lower
// copies the whole pack up into the layer (the layer then costs the
// pack's size, and the harness's commit the copy). A sealed pack's times
// cannot be set by the harness; git writes that object loose instead.
// Git, as the owner, still deletes sealed packs when it repacks (their
// directory is the owner's). For the lower of a layered worktree only:
// shim's gits are the only ones writing there. It does nothing where shim
// is not root.
func (g *Guard) SealPacks() error {
	if os.Geteuid() != 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.open(true); err != nil {
		return err
	}
	return sealPacks(g.gitDir)
}

func sealPacks(gitDir string) error {
	pfd, err := openDir(gitDir + "/objects/pack")
	if isNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	names, err := readDirNames(pfd)
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if !strings.HasPrefix(n, "pack-") {
			continue
		}
		// Through a descriptor of the file the name is (never a symlink
		// swapped in after a stat), and only a file of one name: a hard
		// link of another's file planted in the git dir is left alone.
		fd, err := unix.Openat(pfd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 || st.Uid == 0 && st.Mode&0o222 == 0 {
			unix.Close(fd)
			continue
		}
		if err := unix.Fchown(fd, 0, 0); err != nil {
			errs = append(errs, err)
		} else if err := unix.Fchmod(fd, st.Mode&0o555); err != nil {
			errs = append(errs, err)
		}
		unix.Close(fd)
	}
	return errors.Join(errs...)
}
