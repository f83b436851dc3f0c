package gitguard

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/adler32"
	"hash/crc32"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// An objectStore answers whether the trusted git dir has an object, from
// the names of its loose objects and its packs' indexes, read by shim: a
// git per question costs a fence milliseconds (far more in a container),
// and a layer snapshot asks about every object of the harness's commits.
// It answers only for a store it can read whole (see openObjectStore).
type objectStore struct {
	ofd    int // the git dir's objects directory
	hexLen int
	packs  []packIndex
	// fanout: the loose objects' directories there are (objects/xx),
	// each with the names in it once read: a directory listing per
	// directory asked about, not a stat per object (on a FUSE root, a
	// container's, each costs a round trip to the daemon; and a repository
	// shim keeps seldom has loose objects at all).
	fanout map[string]map[string]bool
	// budget, when positive, bounds the bytes read inflates (deltas
	// and their bases too): past it a read fails (errObject). bases
	// keeps the delta bases read so far (a pack's trees are deltas of
	// each other), up to maxBaseCache bytes.
	budget    int64
	bases     map[[2]uint64][]byte
	basesSize int
}

// A packIndex is one pack's index (version 2), mapped, and, once an
// object's type is asked for, its pack.
type packIndex struct {
	name   string // pack-<sum>.idx
	data   []byte
	n      int
	fanout []byte // 256 big-endian counts
	names  []byte // n sorted object names
	pack   []byte // the pack, mapped by typeOf (nil until then)
}

// openObjectStore opens the objects directory of gitDir for has. ok is
// false when it cannot answer alone: objects borrowed from elsewhere
// (alternates), or a pack index it does not read (another version, or
// truncated); git answers then.
func openObjectStore(gitDir string, hexLen int) (s *objectStore, ok bool) {
	ofd, err := openDir(gitDir + "/objects")
	if err != nil {
		return nil, false
	}
	s = &objectStore{ofd: ofd, hexLen: hexLen, fanout: map[string]map[string]bool{}}
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
		p, err := mapIndex(pfd, n, hexLen/2)
		if err != nil {
			s.close()
			return nil, false
		}
		s.packs = append(s.packs, p)
	}
	return s, true
}

// mapIndex maps the version 2 pack index name (in the directory open at
// pfd) and checks that its size is its object count's.
func mapIndex(pfd int, name string, hashLen int) (packIndex, error) {
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return packIndex{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return packIndex{}, err
	}
	const head = 8 + 256*4
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < head+2*int64(hashLen) {
		return packIndex{}, fmt.Errorf("%s: not a pack index", name)
	}
	data, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return packIndex{}, err
	}
	p, err := parseIndex(name, data, hashLen)
	if err != nil {
		unix.Munmap(data)
	}
	return p, err
}

// parseIndex reads the bytes of the version 2 pack index name: its header,
// its fan-out table, and a size that holds the object count the fan-out
// says (names, CRCs, offsets, two checksums). What it does not check
// (names sorted, the fan-out monotonic, offsets within the pack) find and
// offset bound themselves.
func parseIndex(name string, data []byte, hashLen int) (packIndex, error) {
	const head = 8 + 256*4
	if len(data) < head+2*hashLen || !bytes.Equal(data[:8], []byte{0xff, 't', 'O', 'c', 0, 0, 0, 2}) {
		return packIndex{}, fmt.Errorf("%s: not a version 2 pack index", name)
	}
	p := packIndex{name: name, data: data, fanout: data[8:head]}
	p.n = int(binary.BigEndian.Uint32(p.fanout[255*4:]))
	min := int64(head) + int64(p.n)*int64(hashLen+8) + 2*int64(hashLen)
	if int64(len(data)) < min {
		return packIndex{}, fmt.Errorf("%s: not a version 2 pack index of its size", name)
	}
	p.names = data[head : head+p.n*hashLen]
	return p, nil
}

// has reports whether the store has object id (a full name of the
// store's length): a loose object's file, or a pack's index entry.
func (s *objectStore) has(id string) bool {
	if len(id) != s.hexLen {
		return false
	}
	if s.hasLoose(id) {
		return true
	}
	raw, err := hex.DecodeString(id)
	if err != nil {
		return false
	}
	for i := range s.packs {
		if s.packs[i].has(raw) {
			return true
		}
	}
	return false
}

// hasPacked reports whether a pack of the store has id.
func (s *objectStore) hasPacked(id string) bool {
	raw, err := hex.DecodeString(id)
	if err != nil || len(id) != s.hexLen {
		return false
	}
	for i := range s.packs {
		if s.packs[i].has(raw) {
			return true
		}
	}
	return false
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

func (p *packIndex) has(raw []byte) bool {
	_, ok := p.find(raw)
	return ok
}

// find is the position of raw (a whole object name) among the index's
// names.
func (p *packIndex) find(raw []byte) (int, bool) {
	if len(raw) == 0 || len(p.fanout) < 256*4 {
		return 0, false
	}
	lo := 0
	if raw[0] > 0 {
		lo = int(binary.BigEndian.Uint32(p.fanout[(int(raw[0])-1)*4:]))
	}
	hi := int(binary.BigEndian.Uint32(p.fanout[int(raw[0])*4:]))
	if hi > p.n || lo > hi {
		return 0, false
	}
	l := len(raw)
	i := lo + sort.Search(hi-lo, func(i int) bool {
		return bytes.Compare(p.names[(lo+i)*l:(lo+i+1)*l], raw) >= 0
	})
	return i, i < hi && bytes.Equal(p.names[i*l:(i+1)*l], raw)
}

// offset is where the i-th object of the index starts in its pack; false
// when the index says more than its size holds.
func (p *packIndex) offset(i, hashLen int) (uint64, bool) {
	at := 8 + 256*4 + p.n*(hashLen+4) + i*4
	if at+4 > len(p.data) {
		return 0, false
	}
	o := binary.BigEndian.Uint32(p.data[at:])
	if o&(1<<31) == 0 {
		return uint64(o), true
	}
	at = 8 + 256*4 + p.n*(hashLen+8) + int(o&^(1<<31))*8
	if at+8 > len(p.data) {
		return 0, false
	}
	return binary.BigEndian.Uint64(p.data[at:]), true
}

// Object types as packs and loose headers name them.
const (
	objCommit = 1
	objTree   = 2
	objBlob   = 3
	objTag    = 4
	objOfs    = 6 // a delta against the entry at a distance before it
	objRef    = 7 // a delta against the object named after its header
)

// typeOf is the type of object id in the store (objCommit, objTree,
// objBlob, objTag), 0 when the store does not have it or cannot tell: a
// loose object's header, or a pack entry's, a delta's that of its base
// (nothing is inflated but a loose object's header).
func (s *objectStore) typeOf(id string) int {
	if len(id) != s.hexLen {
		return 0
	}
	raw, err := hex.DecodeString(id)
	if err != nil {
		return 0
	}
	for i := range s.packs {
		if at, ok := s.packs[i].find(raw); ok {
			return s.packType(i, at)
		}
	}
	if !s.hasLoose(id) {
		return 0
	}
	dfd, err := openDirAt(s.ofd, id[:2])
	if err != nil {
		return 0
	}
	defer unix.Close(dfd)
	b, _, err := readFileAt(dfd, id[2:], maxLooseObject)
	if err != nil {
		return 0
	}
	zr, err := inflater(bytes.NewReader(b))
	if err != nil {
		return 0
	}
	defer inflaters.Put(zr)
	hdr, err := bufio.NewReaderSize(zr, 64).ReadString(' ')
	if err != nil {
		return 0
	}
	return objectType(strings.TrimSuffix(hdr, " "))
}

// objectType is the type a loose header names (0 for none).
func objectType(name string) int {
	switch name {
	case "commit":
		return objCommit
	case "tree":
		return objTree
	case "blob":
		return objBlob
	case "tag":
		return objTag
	}
	return 0
}

// packType is the type of the at-th object of pack i: its entry's,
// following deltas to their base (at most a chain git would write).
func (s *objectStore) packType(i, at int) int {
	hashLen := s.hexLen / 2
	for hops := 0; hops < 10000; hops++ {
		p := &s.packs[i]
		if p.pack == nil && !s.mapPack(p) {
			return 0
		}
		off, ok := p.offset(at, hashLen)
		if !ok {
			return 0
		}
		for { // an OFS_DELTA's base is in the same pack
			typ, _, pos, ok := entryHeader(p.pack, off)
			if !ok {
				return 0
			}
			switch typ {
			case objCommit, objTree, objBlob, objTag:
				return typ
			case objOfs:
				if off, _, ok = ofsBase(p.pack, off, pos); !ok {
					return 0
				}
				hops++
				if hops >= 10000 {
					return 0
				}
				continue
			case objRef:
				if pos+uint64(hashLen) > uint64(len(p.pack)) {
					return 0
				}
				base := p.pack[pos : pos+uint64(hashLen)]
				found := false
				for j := range s.packs {
					if k, ok := s.packs[j].find(base); ok {
						i, at, found = j, k, true
						break
					}
				}
				if !found {
					return 0
				}
			default:
				return 0
			}
			break
		}
	}
	return 0
}

// entryHeader reads the header of the pack entry at off: its type, its
// size (inflated; a delta's), and where what follows the header begins.
func entryHeader(pack []byte, off uint64) (typ int, size, pos uint64, ok bool) {
	if off >= uint64(len(pack)) {
		return 0, 0, 0, false
	}
	c := pack[off]
	typ, size, pos = int(c>>4&7), uint64(c&0x0f), off+1
	for shift := 4; c&0x80 != 0; shift += 7 { // seven bits at a time
		if pos >= uint64(len(pack)) || shift > 60 {
			return 0, 0, 0, false
		}
		c = pack[pos]
		pos++
		size |= uint64(c&0x7f) << shift
	}
	return typ, size, pos, true
}

// ofsBase reads the base offset of the OFS_DELTA entry at off, whose
// header ends at pos, and where its delta begins.
func ofsBase(pack []byte, off, pos uint64) (base, next uint64, ok bool) {
	var dist uint64
	for n := 0; ; n++ {
		if pos >= uint64(len(pack)) || n > 9 {
			return 0, 0, false
		}
		c := pack[pos]
		pos++
		dist = dist<<7 | uint64(c&0x7f)
		if c&0x80 == 0 {
			break
		}
		dist++
	}
	if dist == 0 || dist > off {
		return 0, 0, false
	}
	return off - dist, pos, true
}

// mapPack maps the pack of index p (read only).
func (s *objectStore) mapPack(p *packIndex) bool {
	fd, err := unix.Openat(s.ofd, "pack/"+strings.TrimSuffix(p.name, ".idx")+".pack", unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size < 12 {
		return false
	}
	b, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return false
	}
	p.pack = b
	return true
}

func (s *objectStore) close() {
	for _, p := range s.packs {
		unix.Munmap(p.data)
		if p.pack != nil {
			unix.Munmap(p.pack)
		}
	}
	s.packs = nil
	unix.Close(s.ofd)
}

// A packEntry is where writePack put one object: its name, its offset in
// the pack and the CRC-32 of its entry's bytes (what an index holds).
type packEntry struct {
	id     []byte
	offset uint64
	crc    uint32
}

// addPack writes objs (read again from the layer, below lfd, where their
// bytes were not kept) into the store as one pack and its index, the
// files git's index-pack would write: each written to a temporary name,
// synced, then renamed, the index last (git sees a pack only by its
// index). They are shim's, read-only: sealed (see SealPacks).
func (s *objectStore) addPack(lfd int, objs []looseObject) error {
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
		return err
	}
	defer unix.Close(pfd)
	tmp := "tmp_pack_shim_" + strconv.Itoa(os.Getpid())
	// create writes a temporary file; synced by the caller (the pack's
	// sync runs beside the index's writing).
	create := func(name string, write func(w io.Writer) error) (*os.File, error) {
		unix.Unlinkat(pfd, name, 0) // a leftover of a fence that stopped here
		fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
		if err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(fd), name)
		err = write(f)
		if err != nil {
			f.Close()
			unix.Unlinkat(pfd, name, 0)
			return nil, err
		}
		return f, nil
	}
	var entries []packEntry
	var sum []byte
	pack, err := create(tmp+".pack", func(w io.Writer) (err error) {
		entries, sum, err = writePack(w, lfd, objs, s.hexLen)
		return err
	})
	if err != nil {
		return err
	}
	err = parallel(pack.Sync, func() error {
		idx, err := create(tmp+".idx", func(w io.Writer) error { return writeIndex(w, entries, sum, s.hexLen) })
		if err != nil {
			return err
		}
		err = idx.Sync()
		if cerr := idx.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if cerr := pack.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		unix.Unlinkat(pfd, tmp+".pack", 0)
		unix.Unlinkat(pfd, tmp+".idx", 0)
		return err
	}
	name := "pack-" + hex.EncodeToString(sum)
	if err := unix.Renameat(pfd, tmp+".pack", pfd, name+".pack"); err != nil {
		unix.Unlinkat(pfd, tmp+".idx", 0)
		return err
	}
	if err := unix.Renameat(pfd, tmp+".idx", pfd, name+".idx"); err != nil {
		return err
	}
	return unix.Fsync(pfd)
}

// writePack writes a version 2 pack of objs (each whole, none a delta,
// its zlib stream of stored blocks; those whose bytes were not kept are
// read again from the layer, below lfd) to w, and returns where it put
// each and the pack's checksum.
func writePack(w io.Writer, lfd int, objs []looseObject, hexLen int) ([]packEntry, []byte, error) {
	sum := objectHash(hexLen)
	bw := bufio.NewWriterSize(io.MultiWriter(w, sum), 1<<16)
	out := &entryWriter{w: bw, crc: crc32.NewIEEE()}
	hdr := []byte{'P', 'A', 'C', 'K', 0, 0, 0, 2, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hdr[8:], uint32(len(objs)))
	out.Write(hdr)
	entries := make([]packEntry, 0, len(objs))
	buf := make([]byte, 65535)
	for _, o := range objs {
		id, _ := hex.DecodeString(o.dir + o.name)
		e := packEntry{id: id, offset: uint64(out.n)}
		out.crc.Reset()
		var body io.Reader = bytes.NewReader(o.data)
		var check hash.Hash
		var f io.Closer // a loose file read again: streamed, never held whole
		if o.data == nil && o.size > 0 {
			zr, lf, err := openLoose(lfd, o.dir, o.name)
			if err != nil {
				return nil, nil, err
			}
			f = lf
			br := bufio.NewReader(zr)
			hdr, err := br.ReadString(0) // the loose header, checked before
			if err != nil {
				lf.Close()
				return nil, nil, err
			}
			// and hashed again with what is read now: the pack holds the
			// bytes that had the name, or nothing
			check = objectHash(hexLen)
			check.Write([]byte(hdr))
			body = io.TeeReader(br, check)
		}
		// The entry's header: its type and size, seven bits at a time
		// after the first four.
		var h []byte
		c := byte(o.typ<<4) | byte(o.size&0x0f)
		for rest := o.size >> 4; rest > 0; rest >>= 7 {
			h = append(h, c|0x80)
			c = byte(rest & 0x7f)
		}
		out.Write(append(h, c))
		err := writeStored(out, io.LimitReader(body, o.size), o.size, buf)
		if f != nil {
			f.Close()
		}
		if err != nil {
			return nil, nil, fmt.Errorf("object %s%s: %v", o.dir, o.name, err)
		}
		if check != nil && hex.EncodeToString(check.Sum(nil)) != o.dir+o.name {
			return nil, nil, fmt.Errorf("object %s%s changed since it was checked", o.dir, o.name)
		}
		e.crc = out.crc.Sum32()
		entries = append(entries, e)
	}
	if err := bw.Flush(); err != nil {
		return nil, nil, err
	}
	s := sum.Sum(nil)
	_, err := w.Write(s)
	return entries, s, err
}

// writeStored writes the size bytes of r to w as a zlib stream of stored
// (uncompressed) deflate blocks: what a pack entry needs, at the cost of
// a copy (compress/flate at its fastest took 10-17 ms for a commit's 200
// objects, most of a snapshot's import of them; index-pack takes any
// zlib stream, and a full repack compresses them again). buf, of at
// least a block's 65,535 bytes, is the copy's.
func writeStored(w io.Writer, r io.Reader, size int64, buf []byte) error {
	w.Write([]byte{0x78, 0x01})
	sum := adler32.New()
	buf = buf[:65535]
	for left := size; ; {
		n := int(min(left, int64(len(buf))))
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return fmt.Errorf("%d of %d bytes: %w", size-left, size, err)
		}
		left -= int64(n)
		final := byte(0)
		if left == 0 {
			final = 1
		}
		w.Write([]byte{final, byte(n), byte(n >> 8), ^byte(n), ^byte(n >> 8)})
		w.Write(buf[:n])
		sum.Write(buf[:n])
		if left == 0 {
			break
		}
	}
	var tail [4]byte
	binary.BigEndian.PutUint32(tail[:], sum.Sum32())
	_, err := w.Write(tail[:])
	return err
}

// objectHash is the hash of a repository whose object names have hexLen
// hex digits (SHA-256 for 64, else SHA-1).
func objectHash(hexLen int) hash.Hash {
	if hexLen == 64 {
		return sha256.New()
	}
	return sha1.New()
}

// entryWriter is the pack's bytes on their way to its buffer: counted
// (an entry's offset) and summed (its CRC-32).
type entryWriter struct {
	w   *bufio.Writer
	crc hash.Hash32
	n   int64
}

func (e *entryWriter) Write(p []byte) (int, error) {
	e.crc.Write(p)
	e.n += int64(len(p))
	return e.w.Write(p)
}

// writeIndex writes the version 2 index of a pack whose entries and
// checksum are these (what `git index-pack` writes for it).
func writeIndex(w io.Writer, entries []packEntry, packSum []byte, hexLen int) error {
	sort.Slice(entries, func(i, j int) bool { return bytes.Compare(entries[i].id, entries[j].id) < 0 })
	sum := objectHash(hexLen)
	bw := bufio.NewWriter(io.MultiWriter(w, sum))
	bw.Write([]byte{0xff, 't', 'O', 'c', 0, 0, 0, 2})
	var b4 [4]byte
	put := func(v uint32) {
		binary.BigEndian.PutUint32(b4[:], v)
		bw.Write(b4[:])
	}
	i := 0
	for first := 0; first < 256; first++ {
		for i < len(entries) && int(entries[i].id[0]) <= first {
			i++
		}
		put(uint32(i))
	}
	for _, e := range entries {
		bw.Write(e.id)
	}
	for _, e := range entries {
		put(e.crc)
	}
	var large []uint64 // offsets of 2 GiB and more, in their own table
	for _, e := range entries {
		if e.offset < 1<<31 {
			put(uint32(e.offset))
			continue
		}
		put(1<<31 | uint32(len(large)))
		large = append(large, e.offset)
	}
	var b8 [8]byte
	for _, o := range large {
		binary.BigEndian.PutUint64(b8[:], o)
		bw.Write(b8[:])
	}
	bw.Write(packSum)
	if err := bw.Flush(); err != nil {
		return err
	}
	_, err := w.Write(sum.Sum(nil))
	return err
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
