package gitformat

// The red team's shapes of packs, indexes and deltas: what a hostile
// harness can plant in its layer for shim to read. Seeds of the fuzz
// targets, and each a unit test of its own (TestRedTeamShapes).

import (
	"bytes"
	"encoding/binary"
	"strconv"
)

// packHead is a version 2 pack's header for n objects.
func packHead(n int) []byte {
	b := []byte("PACK\x00\x00\x00\x02\x00\x00\x00\x00")
	binary.BigEndian.PutUint32(b[8:], uint32(n))
	return b
}

// entry is a pack entry's header of type typ and declared size.
func entry(typ int, size uint64) []byte {
	c := byte(typ<<4) | byte(size&0x0f)
	size >>= 4
	var b []byte
	for size > 0 {
		b = append(b, c|0x80)
		c = byte(size & 0x7f)
		size >>= 7
	}
	return append(b, c)
}

// ofsDistance is an OFS_DELTA's base distance as git writes it.
func ofsDistance(d uint64) []byte {
	b := []byte{byte(d & 0x7f)}
	for d >>= 7; d > 0; d >>= 7 {
		d--
		b = append([]byte{byte(0x80 | d&0x7f)}, b...)
	}
	return b
}

// varint is a delta header's size.
func varint(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// emptyIndex is a version 2 index of no object (and its two checksums).
func emptyIndex() []byte {
	return append(append([]byte(nil), idxMagic...), make([]byte, 256*4+2*20)...)
}

// indexOf is a version 2 index of the given (sorted) names at these
// offsets; an offset of 2^31 or more goes to the 64-bit table.
func indexOf(names [][]byte, offsets []uint64) []byte {
	b := append([]byte(nil), idxMagic...)
	for first := 0; first < 256; first++ {
		n := 0
		for _, id := range names {
			if int(id[0]) <= first {
				n++
			}
		}
		b = binary.BigEndian.AppendUint32(b, uint32(n))
	}
	for _, id := range names {
		b = append(b, id...)
	}
	b = append(b, make([]byte, 4*len(names))...) // CRCs
	var large []uint64
	for _, o := range offsets {
		if o < 1<<31 {
			b = binary.BigEndian.AppendUint32(b, uint32(o))
			continue
		}
		b = binary.BigEndian.AppendUint32(b, 1<<31|uint32(len(large)))
		large = append(large, o)
	}
	for _, o := range large {
		b = binary.BigEndian.AppendUint64(b, o)
	}
	return append(b, make([]byte, 40)...)
}

// A shape is a pack, its index and the offset a read starts at.
type shape struct {
	name      string
	pack, idx []byte
	off       uint64
}

// copyAll is a delta that makes its result by copying the whole base n
// times (a result n times its base's size).
func copyAll(baseSize, n int) []byte {
	d := append(varint(uint64(baseSize)), varint(uint64(baseSize*n))...)
	for i := 0; i < n; i++ {
		d = append(d, 0x80|0x10|0x20, byte(baseSize), byte(baseSize>>8))
	}
	return d
}

// redTeamPacks are the hostile packs: declared sizes past any bound,
// truncated zlib, self-referencing and out-of-pack OFS_DELTAs, an
// overflowing distance, REF_DELTA cycles, a delta bomb (each delta
// doubles its base), an index whose 64-bit offset is past the pack. (The
// chain deeper than git writes, 70 KiB and 60 ms a read, is
// TestRedTeamShapes' only: the fuzzer mutates one of 50 deltas.)
func redTeamPacks() []shape {
	pre := packHead(1)
	blob := append(entry(Blob, 5), zlibOf([]byte("hello"))...)
	one := func(e ...[]byte) []byte { return bytes.Join(append([][]byte{pre}, e...), nil) }
	idA, idB := bytes.Repeat([]byte{0xaa}, 20), bytes.Repeat([]byte{0xbb}, 20)
	shapes := []shape{
		{"a blob", one(blob), emptyIndex(), 12},
		{"a declared size of 2^60", one(entry(Blob, 1<<60), zlibOf([]byte("x"))), emptyIndex(), 12},
		{"a header of 11 continuation bytes", one(bytes.Repeat([]byte{0xff}, 11)), emptyIndex(), 12},
		{"truncated zlib", one(blob[:len(blob)-3]), emptyIndex(), 12},
		{"more bytes than declared", one(entry(Blob, 2), zlibOf([]byte("hello"))), emptyIndex(), 12},
		{"an OFS_DELTA on itself", one(entry(OfsDelta, 4), []byte{0x00}), emptyIndex(), 12},
		{"an OFS_DELTA before the pack", one(entry(OfsDelta, 4), []byte{0x7f}), emptyIndex(), 12},
		{"an overflowing OFS distance", one(entry(OfsDelta, 4), bytes.Repeat([]byte{0xff}, 10), []byte{0x7f}), emptyIndex(), 12},
		{"an entry of type 5", one(entry(5, 1), zlibOf([]byte("x"))), emptyIndex(), 12},
		{"an offset past the pack", one(blob), emptyIndex(), 1 << 40},
	}
	// A REF_DELTA on its own name, and two naming each other: cycles
	// through the index.
	self := one(entry(RefDelta, 4), idA, zlibOf([]byte{5, 5, 0x90, 5}))
	shapes = append(shapes, shape{"a REF_DELTA on itself", self, indexOf([][]byte{idA}, []uint64{12}), 12})
	a := append(entry(RefDelta, 4), idB...)
	a = append(a, zlibOf([]byte{5, 5, 0x90, 5})...)
	b := append(entry(RefDelta, 4), idA...)
	b = append(b, zlibOf([]byte{5, 5, 0x90, 5})...)
	two := bytes.Join([][]byte{packHead(2), a, b}, nil)
	shapes = append(shapes, shape{"two REF_DELTAs on each other", two, indexOf([][]byte{idA, idB}, []uint64{12, 12 + uint64(len(a))}), 12})
	// A 64-bit offset past the pack.
	shapes = append(shapes, shape{"a 64-bit offset", one(blob), indexOf([][]byte{idA}, []uint64{1 << 40}), 0})
	return append(shapes, deltaBomb(24))
}

// deepChain is a blob and n OFS_DELTAs, each on the one before: deeper
// than git writes past maxDeltaChain. The read starts at the last.
func deepChain(n int) shape {
	p := packHead(n + 1)
	offs := []uint64{uint64(len(p))}
	p = append(p, entry(Blob, 5)...)
	p = append(p, zlibOf([]byte("hello"))...)
	d := zlibOf([]byte{5, 5, 0x90, 5}) // copy the 5 bytes of the base
	for i := 0; i < n; i++ {
		at := uint64(len(p))
		p = append(p, entry(OfsDelta, 4)...)
		p = append(p, ofsDistance(at-offs[len(offs)-1])...)
		p = append(p, d...)
		offs = append(offs, at)
	}
	return shape{"a chain of " + strconv.Itoa(n) + " deltas", p, emptyIndex(), offs[len(offs)-1]}
}

// deltaBomb is a blob of 64 bytes and up to n OFS_DELTAs, each doubling
// the one before, up to 4 MiB declared in a few KiB.
func deltaBomb(n int) shape {
	p := packHead(n + 1)
	prev := uint64(len(p))
	p = append(p, entry(Blob, 64)...)
	p = append(p, zlibOf(bytes.Repeat([]byte{'x'}, 64))...)
	size := 64
	for i := 0; i < n && size < 1<<22; i++ {
		at := uint64(len(p))
		d := copyAll(size, 2)
		if size >= 1<<16 { // copy in blocks of at most 2^16
			d = append(varint(uint64(size)), varint(uint64(2*size))...)
			for k := 0; k < 2*size/(1<<16); k++ {
				off := (k * (1 << 16)) % size
				d = append(d, 0x80|0x01|0x02|0x04, byte(off), byte(off>>8), byte(off>>16))
			}
		}
		p = append(p, entry(OfsDelta, uint64(len(d)))...)
		p = append(p, ofsDistance(at-prev)...)
		p = append(p, zlibOf(d)...)
		prev, size = at, 2*size
	}
	return shape{"a delta bomb", p, emptyIndex(), prev}
}
