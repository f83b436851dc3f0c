package gitformat

// Loose objects: a zlib stream of a header, "TYPE SIZE" and a NUL, then
// the object's bytes; its name is the hash of both (git's
// odb/source-loose.c, parse_loose_header in object-file.c).

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maxHeaderLen bounds a loose object's header, its NUL included: git's
// MAX_HEADER_LEN (object-file.h), past which git reports the header "too
// long" (odb/source-loose.c) rather than read on.
const maxHeaderLen = 32

// ParseLoose reads loose object id (a full name) from z, its file's bytes:
// at most max bytes of object, charged to budget (nil: none), checked
// against its name. It returns the object's type and bytes.
func ParseLoose(id string, z []byte, max int64, budget *Budget) (int, []byte, error) {
	data, err := inflateAll(z, max+64)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %s: %v", ErrUnreadable, id, err)
	}
	if err := budget.Charge(uint64(len(data))); err != nil {
		return 0, nil, err
	}
	h := NewHash(len(id))
	h.Write(data)
	if hex.EncodeToString(h.Sum(nil)) != id {
		return 0, nil, fmt.Errorf("%w: %s: not the object its name says", ErrUnreadable, id)
	}
	hdr, body, ok := bytes.Cut(data, []byte{0})
	name, size, _ := bytes.Cut(hdr, []byte{' '})
	n, err := strconv.ParseInt(string(size), 10, 64)
	typ := typeFromName(string(name))
	if !ok || err != nil || typ == 0 || n != int64(len(body)) || n > max {
		return 0, nil, fmt.Errorf("%w: %s: a bad header", ErrUnreadable, id)
	}
	return typ, body, nil
}

// LooseType is the type a loose object's header names (0 for none, or a
// header it cannot read): nothing past the header, at most maxHeaderLen
// bytes, is inflated.
func LooseType(z []byte) int {
	zr, err := inflater(bytes.NewReader(z))
	if err != nil {
		return 0
	}
	defer inflaters.Put(zr)
	var hdr [maxHeaderLen]byte
	n, _ := io.ReadFull(zr, hdr[:])
	name, _, ok := bytes.Cut(hdr[:n], []byte{' '})
	if !ok {
		return 0
	}
	return typeFromName(string(name))
}

// ReadLooseHeader reads a loose object's header from r, the object
// inflated: through its NUL, which it includes, at most maxHeaderLen
// bytes (a stream with no NUL is read no further).
func ReadLooseHeader(r io.ByteReader) (string, error) {
	var b []byte
	for len(b) < maxHeaderLen {
		c, err := r.ReadByte()
		if err != nil {
			return string(b), err
		}
		b = append(b, c)
		if c == 0 {
			return string(b), nil
		}
	}
	return string(b), fmt.Errorf("a loose object's header longer than %d bytes", maxHeaderLen)
}

// A LooseCheck is what VerifyLoose found of a loose object.
type LooseCheck struct {
	Type     int   // its type, from its header
	Size     int64 // its size, from its header
	OK       bool  // whether it is whole, of git's own header, and hashes to its name
	Inflated int64 // the bytes inflated to find out (the caller's budget)
}

// VerifyLoose checks the loose object's file r reads against its name id
// (SHA-1 or SHA-256 by its length) as a stream: a header of git's own
// shape ("blob 5": index-pack gives the object that header, so a name
// hashed over "blob +5" or "blob 05" is not the name it gets) of at most
// limit bytes, then exactly that many bytes. At most limit bytes and the
// header are inflated, whatever the stream holds, and nothing is held
// whole but what keep asks for: keep, if set, receives the object's bytes
// when they are at most keepMax.
func VerifyLoose(r io.Reader, id string, limit int64, keep *bytes.Buffer, keepMax int64) LooseCheck {
	zr, err := inflater(r)
	if err != nil {
		return LooseCheck{}
	}
	defer inflaters.Put(zr)
	br := bufio.NewReaderSize(zr, 64)
	hdr, err := ReadLooseHeader(br)
	bad := LooseCheck{Inflated: int64(len(hdr))}
	if err != nil {
		return bad
	}
	f := strings.Fields(strings.TrimSuffix(hdr, "\x00"))
	if len(f) != 2 {
		return bad
	}
	typ := typeFromName(f[0])
	size, err := strconv.ParseInt(f[1], 10, 64)
	if typ == 0 || err != nil || size < 0 || size > limit || hdr != f[0]+" "+strconv.FormatInt(size, 10)+"\x00" {
		return bad
	}
	h := NewHash(len(id))
	h.Write([]byte(hdr))
	var dst io.Writer = h
	if keep != nil && size <= keepMax { // a bigger one is read again
		dst = io.MultiWriter(h, keep)
	}
	n, err := io.Copy(dst, io.LimitReader(br, size+1))
	if err != nil || n != size {
		return LooseCheck{Inflated: int64(len(hdr)) + n}
	}
	return LooseCheck{Type: typ, Size: size, OK: hex.EncodeToString(h.Sum(nil)) == id, Inflated: int64(len(hdr)) + n}
}

// OpenLoose inflates the loose object's file r reads, as a stream, and
// reads its header (ReadLooseHeader: at most maxHeaderLen bytes, through
// its NUL): it returns the header and a reader of the bytes after it,
// nothing held whole. Bounding them by the header's size, and checking
// them against the object's name, is the caller's.
func OpenLoose(r io.Reader) (hdr string, body io.Reader, err error) {
	zr, err := zlib.NewReader(r)
	if err != nil {
		return "", nil, err
	}
	br := bufio.NewReader(zr)
	if hdr, err = ReadLooseHeader(br); err != nil {
		return hdr, nil, err
	}
	return hdr, br, nil
}
