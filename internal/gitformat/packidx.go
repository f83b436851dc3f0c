package gitformat

// Pack indexes, version 2 (git's Documentation/gitformat-pack.adoc): a
// header, a fan-out table of 256 counts, the sorted object names, their
// CRC-32s, their offsets (31 bits, or an index into a table of 64-bit
// offsets), then the pack's checksum and the index's own.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sort"
)

// idxHeader is the header and fan-out table of a version 2 index.
const idxHeader = 8 + 256*4

// idxMagic is a version 2 index's first 8 bytes.
var idxMagic = []byte{0xff, 't', 'O', 'c', 0, 0, 0, 2}

// An Index is a version 2 pack index, read in place (its bytes are
// typically mapped; the caller unmaps Data).
type Index struct {
	Data    []byte
	hashLen int
	n       int
	fanout  []byte // 256 big-endian counts
	names   []byte // n sorted object names
}

// ParseIndex reads the version 2 pack index data of a repository whose
// object names are hashLen bytes: its header, its fan-out table, and a
// size that holds the object count the fan-out says (names, CRCs,
// offsets, two checksums): git's own check (check_packed_git_idx,
// packfile.c) without its upper bound. What it does not check (names
// sorted, the fan-out monotonic, offsets within the pack) Find and Offset
// bound themselves.
func ParseIndex(data []byte, hashLen int) (*Index, error) {
	if len(data) < idxHeader+2*hashLen || !bytes.Equal(data[:8], idxMagic) {
		return nil, errors.New("not a version 2 pack index")
	}
	x := &Index{Data: data, hashLen: hashLen, fanout: data[8:idxHeader]}
	x.n = int(binary.BigEndian.Uint32(x.fanout[255*4:]))
	min := int64(idxHeader) + int64(x.n)*int64(hashLen+8) + 2*int64(hashLen)
	if int64(len(data)) < min {
		return nil, errors.New("not a version 2 pack index of its size")
	}
	x.names = data[idxHeader : idxHeader+x.n*hashLen]
	return x, nil
}

// Len is the number of objects the index lists.
func (x *Index) Len() int { return x.n }

// Find is the position of name (a whole raw object name) among the
// index's names.
func (x *Index) Find(name []byte) (int, bool) {
	if len(name) != x.hashLen || len(x.fanout) < 256*4 {
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
	l := len(name)
	i := lo + sort.Search(hi-lo, func(i int) bool {
		return bytes.Compare(x.names[(lo+i)*l:(lo+i+1)*l], name) >= 0
	})
	return i, i < hi && bytes.Equal(x.names[i*l:(i+1)*l], name)
}

// Offset is where the i-th object of the index starts in its pack; false
// when the index says more than its size holds.
func (x *Index) Offset(i int) (uint64, bool) {
	if i < 0 || i >= x.n {
		return 0, false
	}
	at := idxHeader + x.n*(x.hashLen+4) + i*4
	if at+4 > len(x.Data) {
		return 0, false
	}
	o := binary.BigEndian.Uint32(x.Data[at:])
	if o&(1<<31) == 0 {
		return uint64(o), true
	}
	at = idxHeader + x.n*(x.hashLen+8) + int(o&^(1<<31))*8
	if at+8 > len(x.Data) {
		return 0, false
	}
	return binary.BigEndian.Uint64(x.Data[at:]), true
}
