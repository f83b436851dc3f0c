package gitguard

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"

	"golang.org/x/sys/unix"
)

// errObject is an object the store cannot read alone: missing, of a shape
// shim does not read (a delta chain longer than git writes, a base in
// another pack's REF_DELTA beyond reach), or corrupt. Git reads it then.
var errObject = errors.New("object not readable by shim")

// maxDeltaChain bounds a delta chain shim follows (git's default depth is
// 50; --depth 4095 is its maximum). maxBaseCache bounds the delta bases
// a store keeps.
const (
	maxDeltaChain = 4095
	maxBaseCache  = 8 << 20
)

// charge takes n bytes to inflate from the store's budget, if it has one.
func (s *objectStore) charge(n uint64) error {
	if s.budget == 0 {
		return nil
	}
	if s.budget < 0 || n >= uint64(s.budget) {
		s.budget = -1
		return fmt.Errorf("%w: more bytes to inflate than the read's budget", errObject)
	}
	s.budget -= int64(n)
	return nil
}

// read returns the type and bytes of object id (a full name), at most
// max bytes (its delta bases too): from a loose object's file or a pack's
// entry, deltas applied.
// The bytes are checked against the name only for a loose object (a
// pack's are the store's own, checked when git or shim wrote them).
func (s *objectStore) read(id string, max int64) (int, []byte, error) {
	raw, err := hex.DecodeString(id)
	if err != nil || len(id) != s.hexLen {
		return 0, nil, fmt.Errorf("%w: %q is not an object name", errObject, id)
	}
	for i := range s.packs {
		if at, ok := s.packs[i].find(raw); ok {
			return s.readPacked(i, at, max, 0)
		}
	}
	if !s.hasLoose(id) {
		return 0, nil, fmt.Errorf("%w: %s: missing", errObject, id)
	}
	return s.readLoose(id, max)
}

// readLoose reads a loose object and checks it against its name.
func (s *objectStore) readLoose(id string, max int64) (int, []byte, error) {
	dfd, err := openDirAt(s.ofd, id[:2])
	if err != nil {
		return 0, nil, err
	}
	b, _, err := readFileAt(dfd, id[2:], maxLooseObject)
	unix.Close(dfd)
	if err != nil {
		return 0, nil, err
	}
	return s.looseObject(id, b, max)
}

// looseObject reads the bytes of loose object id's file (zlib: a header,
// TYPE SIZE NUL, then the object), at most max bytes of it, and checks
// them against its name.
func (s *objectStore) looseObject(id string, b []byte, max int64) (int, []byte, error) {
	data, err := inflateAll(b, max+64)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %s: %v", errObject, id, err)
	}
	if err := s.charge(uint64(len(data))); err != nil {
		return 0, nil, err
	}
	h := objectHash(s.hexLen)
	h.Write(data)
	if hex.EncodeToString(h.Sum(nil)) != id {
		return 0, nil, fmt.Errorf("%w: %s: not the object its name says", errObject, id)
	}
	hdr, body, ok := bytes.Cut(data, []byte{0})
	name, size, _ := bytes.Cut(hdr, []byte{' '})
	n, err := strconv.ParseInt(string(size), 10, 64)
	typ := objectType(string(name))
	if !ok || err != nil || typ == 0 || n != int64(len(body)) || n > max {
		return 0, nil, fmt.Errorf("%w: %s: a bad header", errObject, id)
	}
	return typ, body, nil
}

// readPacked reads the at-th object of pack i, applying its deltas.
func (s *objectStore) readPacked(i, at int, max int64, depth int) (int, []byte, error) {
	if depth > maxDeltaChain {
		return 0, nil, fmt.Errorf("%w: a delta chain of more than %d", errObject, maxDeltaChain)
	}
	p := &s.packs[i]
	if p.pack == nil && !s.mapPack(p) {
		return 0, nil, fmt.Errorf("%w: pack %s", errObject, p.name)
	}
	off, ok := p.offset(at, s.hexLen/2)
	if !ok {
		return 0, nil, fmt.Errorf("%w: pack %s: a bad offset", errObject, p.name)
	}
	return s.readAt(i, off, max, depth)
}

// readAt reads the entry at offset off of pack i.
func (s *objectStore) readAt(i int, off uint64, max int64, depth int) (int, []byte, error) {
	if depth > maxDeltaChain {
		return 0, nil, fmt.Errorf("%w: a delta chain of more than %d", errObject, maxDeltaChain)
	}
	if s.budget < 0 {
		return 0, nil, fmt.Errorf("%w: more bytes to inflate than the read's budget", errObject)
	}
	key := [2]uint64{uint64(i), off}
	if b, ok := s.bases[key]; ok {
		return int(b[0]), b[1:], nil
	}
	typ, data, err := s.readEntry(i, off, max, depth)
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
func (s *objectStore) readEntry(i int, off uint64, max int64, depth int) (int, []byte, error) {
	p := &s.packs[i]
	bad := func(why string) (int, []byte, error) {
		return 0, nil, fmt.Errorf("%w: pack %s at %d: %s", errObject, p.name, off, why)
	}
	pack := p.pack
	typ, size, pos, ok := entryHeader(pack, off)
	if !ok {
		return bad("a bad entry header")
	}
	switch typ {
	case objCommit, objTree, objBlob, objTag:
		if size > uint64(max) {
			return bad("larger than " + strconv.FormatInt(max, 10) + " bytes")
		}
		if err := s.charge(size); err != nil {
			return 0, nil, err
		}
		data, err := inflateExact(pack[pos:], int(size))
		if err != nil {
			return bad(err.Error())
		}
		return typ, data, nil
	case objOfs:
		at, pos, ok := ofsBase(pack, off, pos)
		if !ok {
			return bad("a bad delta offset")
		}
		btyp, base, err := s.readAt(i, at, max, depth+1)
		if err != nil {
			return 0, nil, err
		}
		return s.patch(btyp, base, pack[pos:], size, max, bad)
	case objRef:
		hashLen := uint64(s.hexLen / 2)
		if pos+hashLen > uint64(len(pack)) {
			return bad("a bad delta base")
		}
		baseID := pack[pos : pos+hashLen]
		for j := range s.packs {
			if k, ok := s.packs[j].find(baseID); ok {
				btyp, base, err := s.readPacked(j, k, max, depth+1)
				if err != nil {
					return 0, nil, err
				}
				return s.patch(btyp, base, pack[pos+hashLen:], size, max, bad)
			}
		}
		return bad("a delta base in no pack")
	}
	return bad("an entry of type " + strconv.Itoa(typ))
}

// patch inflates the delta of deltaSize bytes at z and applies it to base.
func (s *objectStore) patch(typ int, base, z []byte, deltaSize uint64, max int64, bad func(string) (int, []byte, error)) (int, []byte, error) {
	if deltaSize > maxLooseObject {
		return bad("a delta too large")
	}
	if err := s.charge(deltaSize); err != nil {
		return 0, nil, err
	}
	delta, err := inflateExact(z, int(deltaSize))
	if err != nil {
		return bad(err.Error())
	}
	out, err := applyDelta(base, delta, max)
	if err != nil {
		return bad(err.Error())
	}
	if err := s.charge(uint64(len(out))); err != nil { // its copies' work
		return 0, nil, err
	}
	return typ, out, nil
}

// applyDelta applies a git delta (the base's size, the result's, then
// copy and insert instructions) to base.
func applyDelta(base, delta []byte, max int64) ([]byte, error) {
	varint := func() (uint64, bool) {
		var v uint64
		for shift := 0; len(delta) > 0 && shift < 64; shift += 7 {
			c := delta[0]
			delta = delta[1:]
			v |= uint64(c&0x7f) << shift
			if c&0x80 == 0 {
				return v, true
			}
		}
		return 0, false
	}
	bsize, ok1 := varint()
	rsize, ok2 := varint()
	if !ok1 || !ok2 || bsize != uint64(len(base)) {
		return nil, errors.New("a delta of another base")
	}
	if rsize > uint64(max) {
		return nil, fmt.Errorf("larger than %d bytes", max)
	}
	out := make([]byte, 0, rsize)
	for len(delta) > 0 {
		c := delta[0]
		delta = delta[1:]
		switch {
		case c&0x80 != 0: // copy from the base
			var off, n uint64
			for b := 0; b < 7; b++ {
				if c&(1<<b) == 0 {
					continue
				}
				if len(delta) == 0 {
					return nil, errors.New("a truncated delta")
				}
				if b < 4 {
					off |= uint64(delta[0]) << (8 * b)
				} else {
					n |= uint64(delta[0]) << (8 * (b - 4))
				}
				delta = delta[1:]
			}
			if n == 0 {
				n = 0x10000
			}
			if off+n > uint64(len(base)) || uint64(len(out))+n > rsize {
				return nil, errors.New("a delta copying past its bounds")
			}
			out = append(out, base[off:off+n]...)
		case c != 0: // insert the next c bytes
			n := int(c)
			if n > len(delta) || uint64(len(out)+n) > rsize {
				return nil, errors.New("a delta inserting past its bounds")
			}
			out = append(out, delta[:n]...)
			delta = delta[n:]
		default:
			return nil, errors.New("a delta with a reserved instruction")
		}
	}
	if uint64(len(out)) != rsize {
		return nil, errors.New("a delta of the wrong size")
	}
	return out, nil
}

// inflateExact inflates the zlib stream at the start of z, which must
// hold exactly size bytes.
func inflateExact(z []byte, size int) ([]byte, error) {
	zr, err := inflater(bytes.NewReader(z))
	if err != nil {
		return nil, err
	}
	defer inflaters.Put(zr)
	out := make([]byte, size)
	if _, err := io.ReadFull(zr, out); err != nil {
		return nil, fmt.Errorf("inflate: %v", err)
	}
	var one [1]byte
	switch _, err := io.ReadFull(zr, one[:]); err {
	case io.EOF: // the stream's end, its checksum checked
	case nil:
		return nil, errors.New("inflate: more bytes than the entry says")
	default:
		return nil, fmt.Errorf("inflate: %v", err)
	}
	return out, nil
}

// inflateAll inflates the zlib stream z, at most max bytes.
func inflateAll(z []byte, max int64) ([]byte, error) {
	zr, err := inflater(bytes.NewReader(z))
	if err != nil {
		return nil, err
	}
	defer inflaters.Put(zr)
	out, err := io.ReadAll(io.LimitReader(zr, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(out)) > max {
		return nil, fmt.Errorf("more than %d bytes", max)
	}
	return out, nil
}
