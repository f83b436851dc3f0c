package gitformat

// Pack indexes, version 2 (git's Documentation/gitformat-pack.adoc): a
// header, a fan-out table of 256 counts, the sorted object names, their
// CRC-32s, their offsets (31 bits, or an index into a table of 64-bit
// offsets), then the pack's checksum and the index's own.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"sort"
)

// idxHeader is the header and fan-out table of a version 2 index.
const idxHeader = 8 + 256*4

// idxMagic is a version 2 index's first 8 bytes.
var idxMagic = []byte{0xff, 't', 'O', 'c', 0, 0, 0, 2}

// An Index is a version 2 pack index, read where it is with ReadAt (a
// file's pread): only its fan-out table is held. A mapped index's pages
// are counted in PID 1's RSS, sixteen at a fault (the kernel's
// fault-around), so that a few thousand lookups in a large repository's
// index made most of it resident during a fence (issue 27).
type Index struct {
	r       io.ReaderAt
	size    int64
	hashLen int
	n       int
	fanout  [256 * 4]byte // 256 big-endian counts
	buf     []byte        // names read by Find, reused (at most maxFindRead bytes)
	all     []byte        // the names of an index of at most maxFindRead bytes of them, read once
}

// maxFindRead bounds the names Find reads at once: a fan-out bucket of
// more (a repository of some 800,000 objects) is narrowed down one name
// at a time first. An index of no more names than that (a snapshot's
// pack, most packs of a geometric repack) has them read once and kept
// with it: a lookup misses in every pack but one, and a read per pack per
// lookup cost a fence of 1,000 files some 80 ms.
const maxFindRead = 64 << 10

// ParseIndex reads the version 2 pack index data (see ReadIndex).
func ParseIndex(data []byte, hashLen int) (*Index, error) {
	return ReadIndex(bytes.NewReader(data), int64(len(data)), hashLen)
}

// ReadIndex reads the header of the version 2 pack index of size bytes
// that r reads, of a repository whose object names are hashLen bytes: its
// header, its fan-out table, and a size that holds the object count the
// fan-out says (names, CRCs, offsets, two checksums): git's own check
// (check_packed_git_idx, packfile.c) without its upper bound. What it
// does not check (names sorted, the fan-out monotonic, offsets within
// the pack) Find and Offset bound themselves.
func ReadIndex(r io.ReaderAt, size int64, hashLen int) (*Index, error) {
	x := &Index{r: r, size: size, hashLen: hashLen}
	var head [idxHeader]byte
	if size < idxHeader+2*int64(hashLen) || !x.read(head[:], 0) || !bytes.Equal(head[:8], idxMagic) {
		return nil, errors.New("not a version 2 pack index")
	}
	copy(x.fanout[:], head[8:])
	x.n = int(binary.BigEndian.Uint32(x.fanout[255*4:]))
	min := int64(idxHeader) + int64(x.n)*int64(hashLen+8) + 2*int64(hashLen)
	if size < min {
		return nil, errors.New("not a version 2 pack index of its size")
	}
	return x, nil
}

// read fills b from offset off of the index; false past its size or on
// a read error.
func (x *Index) read(b []byte, off int64) bool {
	if off < 0 || off+int64(len(b)) > x.size {
		return false
	}
	n, err := x.r.ReadAt(b, off)
	return n == len(b) && (err == nil || err == io.EOF)
}

// Len is the number of objects the index lists.
func (x *Index) Len() int { return x.n }

// Find is the position of name (a whole raw object name) among the
// index's names.
func (x *Index) Find(name []byte) (int, bool) {
	l := x.hashLen
	if len(name) != l {
		return 0, false
	}
	lo := 0
	if name[0] > 0 {
		lo = int(binary.BigEndian.Uint32(x.fanout[(int(name[0])-1)*4:]))
	}
	hi := int(binary.BigEndian.Uint32(x.fanout[int(name[0])*4:]))
	if hi > x.n || lo > hi {
		return 0, false
	}
	if x.n*l <= maxFindRead {
		if x.all == nil {
			all := make([]byte, x.n*l)
			if !x.read(all, idxHeader) {
				return 0, false
			}
			x.all = all
		}
		return search(x.all, lo, hi, name)
	}
	for (hi-lo)*l > maxFindRead { // narrowed one name at a time
		mid := lo + (hi-lo)/2
		one := make([]byte, l)
		if !x.read(one, int64(idxHeader+mid*l)) {
			return 0, false
		}
		switch c := bytes.Compare(one, name); {
		case c == 0:
			return mid, true
		case c > 0:
			hi = mid
		default:
			lo = mid + 1
		}
	}
	if cap(x.buf) < (hi-lo)*l {
		x.buf = make([]byte, (hi-lo)*l)
	}
	names := x.buf[:(hi-lo)*l]
	if !x.read(names, int64(idxHeader+lo*l)) {
		return 0, false
	}
	i, ok := search(names, 0, hi-lo, name)
	return lo + i, ok
}

// search is the position of name among the sorted names[lo*len(name):
// hi*len(name)].
func search(names []byte, lo, hi int, name []byte) (int, bool) {
	l := len(name)
	i := lo + sort.Search(hi-lo, func(i int) bool {
		return bytes.Compare(names[(lo+i)*l:(lo+i+1)*l], name) >= 0
	})
	return i, i < hi && bytes.Equal(names[i*l:(i+1)*l], name)
}

// Offset is where the i-th object of the index starts in its pack; false
// when the index says more than its size holds.
func (x *Index) Offset(i int) (uint64, bool) {
	if i < 0 || i >= x.n {
		return 0, false
	}
	var b [8]byte
	if !x.read(b[:4], int64(idxHeader+x.n*(x.hashLen+4)+i*4)) {
		return 0, false
	}
	o := binary.BigEndian.Uint32(b[:4])
	if o&(1<<31) == 0 {
		return uint64(o), true
	}
	if !x.read(b[:], int64(idxHeader+x.n*(x.hashLen+8))+int64(o&^(1<<31))*8) {
		return 0, false
	}
	return binary.BigEndian.Uint64(b[:]), true
}
