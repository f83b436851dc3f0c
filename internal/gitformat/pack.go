package gitformat

// Pack entries (git's Documentation/gitformat-pack.adoc): a header of the
// entry's type and inflated size, seven bits at a time after the first
// four; an OFS_DELTA's base distance, or a REF_DELTA's base name; then a
// zlib stream.

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
)

// maxDeltaChain bounds a delta chain a read follows: git's deepest, the
// --depth pack-objects caps at (1 << OE_DEPTH_BITS) - 1 (pack-objects.h,
// builtin/pack-objects.c); git's default is 50.
const maxDeltaChain = 1<<12 - 1

// maxBaseCache bounds the delta bases a Packs keeps for the next delta on
// them (a pack's trees are deltas of each other): git keeps up to
// core.deltaBaseCacheLimit, DEFAULT_DELTA_BASE_CACHE_LIMIT of 96 MiB
// (pack-objects.h); shim, in PID 1, an eighth of that.
const maxBaseCache = 8 << 20

// maxDeltaSize bounds a delta's own (inflated) size, whatever the size of
// its result: git bounds none (patch_delta, patch-delta.c, checks each
// instruction against the sizes the delta declares, as ApplyDelta does);
// shim inflates no more than it reads of a loose object (64 MiB).
const maxDeltaSize = 64 << 20

// entryHeader reads the header of the pack entry at off: its type, its
// size (inflated; a delta's), and where what follows the header begins.
// false when it runs past the pack or past 64 bits (git's "bad object
// header", unpack_object_header_buffer in packfile.c).
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
// header ends at pos, and where its delta begins: false for a distance
// that overflows, is zero (the entry itself: a cycle) or reaches before
// the pack (git's get_delta_base, packfile.c: "overflow", "out of
// bound").
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

// A Pack is one pack: its name (pack-<sum>), its index, and its bytes:
// read where they are with ReadAt (File, Size bytes; nil until
// Packs.Open opens it), or Data in memory. What a read needs of an entry
// is read into the heap (its header, then its zlib stream through a small
// buffer): a mapped pack's pages are counted in PID 1's RSS, sixteen at a
// fault (the kernel's fault-around), the reason a fence's peak RSS grew
// with the repository (issue 27).
type Pack struct {
	Name  string
	Index *Index
	File  io.ReaderAt
	Size  int64
	Data  []byte
}

// maxEntryHead is the most bytes an entry's header and delta base take:
// a 64-bit size seven bits at a time (10), then an OFS_DELTA's distance
// (10) or a REF_DELTA's name (at most 32).
const maxEntryHead = 64

// packBuffer is the buffer a zlib stream of a pack is read through.
const packBuffer = 4 << 10

// bytes is the pack's reader and size.
func (p *Pack) bytes() (io.ReaderAt, int64) {
	if p.File != nil {
		return p.File, p.Size
	}
	return bytes.NewReader(p.Data), int64(len(p.Data))
}

// head is what may be the header of the entry at off (at most
// maxEntryHead bytes, fewer at the pack's end).
func (p *Pack) head(off uint64) []byte {
	r, size := p.bytes()
	if off >= uint64(size) {
		return nil
	}
	h := make([]byte, min(uint64(maxEntryHead), uint64(size)-off))
	n, _ := r.ReadAt(h, int64(off))
	return h[:n]
}

// stream reads the pack from off on.
func (p *Pack) stream(off uint64) *bufio.Reader {
	r, size := p.bytes()
	if off >= uint64(size) {
		return bufio.NewReaderSize(bytes.NewReader(nil), packBuffer)
	}
	return bufio.NewReaderSize(io.NewSectionReader(r, int64(off), size-int64(off)), packBuffer)
}

// Packs reads objects from a repository's packs, deltas applied, within
// a budget: a REF_DELTA's base may be in any of them.
type Packs struct {
	List    []Pack
	HashLen int
	Budget  *Budget // bytes inflated by every read (nil: none)
	// Open opens a pack's File when a read first needs it; false when it
	// cannot. Nil: File or Data is there already.
	Open func(*Pack) bool
	// bases keeps the delta bases read so far, up to maxBaseCache bytes,
	// each by pack and offset, its type first.
	bases     map[[2]uint64][]byte
	basesSize int
	// chain is the entries of the delta chain being read, by pack and
	// offset: a REF_DELTA naming an object whose entry is already on it
	// is a cycle, refused at once rather than maxDeltaChain levels down.
	chain map[[2]uint64]bool
}

// Find is where an object is: its pack and its position in the pack's
// index.
func (s *Packs) Find(name []byte) (pack, at int, ok bool) {
	for i := range s.List {
		if at, ok := s.List[i].Index.Find(name); ok {
			return i, at, true
		}
	}
	return 0, 0, false
}

// open is pack i, opened if need be.
func (s *Packs) open(i int) (*Pack, bool) {
	p := &s.List[i]
	if p.File == nil && p.Data == nil && (s.Open == nil || !s.Open(p)) {
		return nil, false
	}
	return p, true
}

// Type is the type of the at-th object of pack i (Commit, Tree, Blob,
// Tag): its entry's, following deltas to their base (at most a chain git
// would write), nothing inflated; 0 when it cannot tell.
func (s *Packs) Type(i, at int) int {
	var seen map[[2]int]bool // the REF_DELTAs' bases followed: a cycle stops
	for hops := 0; hops <= maxDeltaChain; hops++ {
		if seen[[2]int{i, at}] {
			return 0
		}
		pack, ok := s.open(i)
		if !ok {
			return 0
		}
		off, ok := s.List[i].Index.Offset(at)
		if !ok {
			return 0
		}
		typ, next := s.entryType(pack, off, &hops)
		if typ != RefDelta {
			return typ
		}
		if seen == nil {
			seen = map[[2]int]bool{}
		}
		seen[[2]int{i, at}] = true
		if i, at, ok = s.Find(next); !ok {
			return 0
		}
	}
	return 0
}

// entryType follows the OFS_DELTA entries from off within pack to a
// whole entry's type, counting hops; a REF_DELTA's is RefDelta and the
// name of its base.
func (s *Packs) entryType(p *Pack, off uint64, hops *int) (int, []byte) {
	for ; *hops <= maxDeltaChain; *hops++ {
		pack := p.head(off)
		typ, _, pos, ok := entryHeader(pack, 0)
		switch {
		case !ok:
			return 0, nil
		case typ >= Commit && typ <= Tag:
			return typ, nil
		case typ == OfsDelta:
			if off, _, ok = ofsBase(pack, off, pos); !ok {
				return 0, nil
			}
		case typ == RefDelta:
			if pos+uint64(s.HashLen) > uint64(len(pack)) {
				return 0, nil
			}
			return RefDelta, pack[pos : pos+uint64(s.HashLen)]
		default:
			return 0, nil
		}
	}
	return 0, nil
}

// Read reads the at-th object of pack i, at most max bytes (each base of
// its deltas too), deltas applied: its type and bytes. The bytes are not
// checked against the object's name (a pack's are its repository's own,
// checked when git or shim wrote them).
func (s *Packs) Read(i, at int, max int64) (int, []byte, error) {
	return s.readPacked(i, at, max, 0)
}

// readPacked reads the at-th object of pack i, depth deltas down.
func (s *Packs) readPacked(i, at int, max int64, depth int) (int, []byte, error) {
	if depth > maxDeltaChain {
		return 0, nil, fmt.Errorf("%w: a delta chain of more than %d", ErrUnreadable, maxDeltaChain)
	}
	if _, ok := s.open(i); !ok {
		return 0, nil, fmt.Errorf("%w: pack %s", ErrUnreadable, s.List[i].Name)
	}
	off, ok := s.List[i].Index.Offset(at)
	if !ok {
		return 0, nil, fmt.Errorf("%w: pack %s: a bad offset", ErrUnreadable, s.List[i].Name)
	}
	return s.readAt(i, off, max, depth)
}

// readAt reads the entry at offset off of pack i, through the base cache.
func (s *Packs) readAt(i int, off uint64, max int64, depth int) (int, []byte, error) {
	if depth > maxDeltaChain {
		return 0, nil, fmt.Errorf("%w: a delta chain of more than %d", ErrUnreadable, maxDeltaChain)
	}
	if s.Budget.spent() {
		return 0, nil, fmt.Errorf("%w: more bytes to inflate than the read's budget", ErrUnreadable)
	}
	key := [2]uint64{uint64(i), off}
	if b, ok := s.bases[key]; ok {
		return int(b[0]), b[1:], nil
	}
	if s.chain[key] {
		return 0, nil, fmt.Errorf("%w: pack %s at %d: a delta cycle", ErrUnreadable, s.List[i].Name, off)
	}
	if s.chain == nil {
		s.chain = map[[2]uint64]bool{}
	}
	s.chain[key] = true
	typ, data, err := s.readEntry(i, off, max, depth)
	delete(s.chain, key)
	if err == nil && depth > 0 && len(data) < maxBaseCache-s.basesSize {
		// a base: kept (its type first) for the next delta on it
		if s.bases == nil {
			s.bases = map[[2]uint64][]byte{}
		}
		s.bases[key] = append([]byte{byte(typ)}, data...)
		s.basesSize += len(data) + 1
	}
	return typ, data, err
}

// readEntry reads the entry at offset off of pack i (readAt's, uncached).
func (s *Packs) readEntry(i int, off uint64, max int64, depth int) (int, []byte, error) {
	// one read for a whole entry of a few KiB: its header, then its
	// stream; a delta's stream is read again once its base is (no buffer
	// held down a delta chain)
	p := &s.List[i]
	z := p.stream(off)
	pack, _ := z.Peek(maxEntryHead) // pack[0] is at off; fewer at the end
	pack = bytes.Clone(pack)        // a REF_DELTA's base name outlives z
	bad := func(why string) (int, []byte, error) {
		return 0, nil, fmt.Errorf("%w: pack %s at %d: %s", ErrUnreadable, s.List[i].Name, off, why)
	}
	typ, size, pos, ok := entryHeader(pack, 0)
	if !ok {
		return bad("a bad entry header")
	}
	switch typ {
	case Commit, Tree, Blob, Tag:
		if size > uint64(max) {
			return bad("larger than " + strconv.FormatInt(max, 10) + " bytes")
		}
		if err := s.Budget.Charge(size); err != nil {
			return 0, nil, err
		}
		z.Discard(int(pos))
		data, err := inflateExactFrom(z, int(size))
		if err != nil {
			return bad(err.Error())
		}
		return typ, data, nil
	case OfsDelta:
		at, pos, ok := ofsBase(pack, off, pos)
		if !ok {
			return bad("a bad delta offset")
		}
		btyp, base, err := s.readAt(i, at, max, depth+1)
		if err != nil {
			return 0, nil, err
		}
		return s.patch(btyp, base, p.stream(off+pos), size, max, bad)
	case RefDelta:
		hashLen := uint64(s.HashLen)
		if pos+hashLen > uint64(len(pack)) {
			return bad("a bad delta base")
		}
		j, k, ok := s.Find(pack[pos : pos+hashLen])
		if !ok {
			return bad("a delta base in no pack")
		}
		btyp, base, err := s.readPacked(j, k, max, depth+1)
		if err != nil {
			return 0, nil, err
		}
		return s.patch(btyp, base, p.stream(off+pos+hashLen), size, max, bad)
	}
	return bad("an entry of type " + strconv.Itoa(typ))
}

// patch inflates the delta of deltaSize bytes at z and applies it to base.
func (s *Packs) patch(typ int, base []byte, z io.Reader, deltaSize uint64, max int64, bad func(string) (int, []byte, error)) (int, []byte, error) {
	if deltaSize > maxDeltaSize {
		return bad("a delta too large")
	}
	if err := s.Budget.Charge(deltaSize); err != nil {
		return 0, nil, err
	}
	delta, err := inflateExactFrom(z, int(deltaSize))
	if err != nil {
		return bad(err.Error())
	}
	out, err := ApplyDelta(base, delta, max)
	if err != nil {
		return bad(err.Error())
	}
	if err := s.Budget.Charge(uint64(len(out))); err != nil { // its copies' work
		return 0, nil, err
	}
	return typ, out, nil
}
