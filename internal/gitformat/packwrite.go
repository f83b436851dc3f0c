package gitformat

// Writing a pack (version 2, every object whole: no deltas) and its index
// (version 2), as git's index-pack would write the index for it.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/adler32"
	"hash/crc32"
	"io"
	"sort"
)

// An IndexEntry is where a PackWriter put one object: its raw name, its
// offset in the pack and the CRC-32 of its entry's bytes (what an index
// holds).
type IndexEntry struct {
	Name   []byte
	Offset uint64
	CRC    uint32
}

// A PackWriter writes a pack of a known number of objects, each whole,
// its zlib stream of stored (uncompressed) deflate blocks: what a pack
// entry needs at the cost of a copy (compress/flate at its fastest took
// 10-17 ms for a commit's 200 objects, most of a snapshot's import of
// them; index-pack takes any zlib stream, and a full repack compresses
// them again).
type PackWriter struct {
	w       io.Writer
	bw      *bufio.Writer
	sum     hash.Hash
	out     *entryWriter
	entries []IndexEntry
	buf     []byte // a stored block's copy
}

// NewPackWriter starts a pack of count objects on w, for a repository
// whose object names have hexLen hex digits.
func NewPackWriter(w io.Writer, count, hexLen int) *PackWriter {
	sum := NewHash(hexLen)
	bw := bufio.NewWriterSize(io.MultiWriter(w, sum), 1<<16)
	p := &PackWriter{w: w, bw: bw, sum: sum, out: &entryWriter{w: bw, crc: crc32.NewIEEE()},
		entries: make([]IndexEntry, 0, count), buf: make([]byte, 65535)}
	hdr := []byte{'P', 'A', 'C', 'K', 0, 0, 0, 2, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hdr[8:], uint32(count))
	p.out.Write(hdr)
	return p
}

// Add writes object name (raw), of type typ and size bytes, read from
// body (exactly size bytes, else an error).
func (p *PackWriter) Add(name []byte, typ int, size int64, body io.Reader) error {
	e, err := p.out.entry(typ, size, body, p.buf)
	if err != nil {
		return err
	}
	e.Name = name
	p.entries = append(p.entries, e)
	return nil
}

// entry writes one whole object's pack entry (its header, then its size
// bytes read from body as a stored zlib stream) and returns where it is
// and its CRC-32.
func (e *entryWriter) entry(typ int, size int64, body io.Reader, buf []byte) (IndexEntry, error) {
	ie := IndexEntry{Offset: uint64(e.n)}
	e.crc.Reset()
	// The entry's header: its type and size, seven bits at a time after
	// the first four.
	var h []byte
	c := byte(typ<<4) | byte(size&0x0f)
	for rest := size >> 4; rest > 0; rest >>= 7 {
		h = append(h, c|0x80)
		c = byte(rest & 0x7f)
	}
	e.Write(append(h, c))
	if err := writeStored(e, io.LimitReader(body, size), size, buf); err != nil {
		return ie, err
	}
	ie.CRC = e.crc.Sum32()
	return ie, nil
}

// Close ends the pack with its checksum and returns where each object is
// and the checksum (the index's, and the pack's name).
func (p *PackWriter) Close() ([]IndexEntry, []byte, error) {
	if err := p.bw.Flush(); err != nil {
		return nil, nil, err
	}
	s := p.sum.Sum(nil)
	_, err := p.w.Write(s)
	return p.entries, s, err
}

// writeStored writes the size bytes of r to w as a zlib stream of stored
// deflate blocks. buf, of at least a block's 65,535 bytes, is the copy's.
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

// entryWriter is the pack's bytes on their way to its buffer: counted
// (an entry's offset) and summed (its CRC-32).
type entryWriter struct {
	w   *bufio.Writer
	crc hash.Hash32
	n   int64
	err error // the buffer's first error (a full disk)
}

func (e *entryWriter) Write(p []byte) (int, error) {
	e.crc.Write(p)
	e.n += int64(len(p))
	n, err := e.w.Write(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// WriteIndex writes the version 2 index of a pack whose entries and
// checksum are these (what `git index-pack` writes for it); it sorts
// entries by name.
func WriteIndex(w io.Writer, entries []IndexEntry, packSum []byte, hexLen int) error {
	sort.Slice(entries, func(i, j int) bool { return bytes.Compare(entries[i].Name, entries[j].Name) < 0 })
	sum := NewHash(hexLen)
	bw := bufio.NewWriter(io.MultiWriter(w, sum))
	bw.Write(idxMagic)
	var b4 [4]byte
	put := func(v uint32) {
		binary.BigEndian.PutUint32(b4[:], v)
		bw.Write(b4[:])
	}
	i := 0
	for first := 0; first < 256; first++ {
		for i < len(entries) && int(entries[i].Name[0]) <= first {
			i++
		}
		put(uint32(i))
	}
	for _, e := range entries {
		bw.Write(e.Name)
	}
	for _, e := range entries {
		put(e.CRC)
	}
	var large []uint64 // offsets of 2 GiB and more, in their own table
	for _, e := range entries {
		if e.Offset < 1<<31 {
			put(uint32(e.Offset))
			continue
		}
		put(1<<31 | uint32(len(large)))
		large = append(large, e.Offset)
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

// A PackFile is where a PackStream writes: a file it appends to, then
// reads back and writes its header's count into.
type PackFile interface {
	io.Writer
	io.ReaderAt
	io.WriterAt
}

// A PackStream writes a pack whose objects are not known in advance, as
// they come: each is named by the hash of its bytes as they are copied,
// and only where each is (an IndexEntry) is held. Finish writes the
// object count into the header and the checksum after the last entry,
// reading the pack back once (git fast-import's fixup_pack_header_footer,
// pack-write.c).
type PackStream struct {
	f       PackFile
	hexLen  int
	bw      *bufio.Writer
	out     *entryWriter
	entries []IndexEntry
	buf     []byte
	err     error // the first write's error: every later call returns it
}

// NewPackStream starts a pack on f (empty), for a repository whose object
// names have hexLen hex digits.
func NewPackStream(f PackFile, hexLen int) *PackStream {
	bw := bufio.NewWriterSize(f, 1<<16)
	p := &PackStream{f: f, hexLen: hexLen, bw: bw, out: &entryWriter{w: bw, crc: crc32.NewIEEE()}, buf: make([]byte, 65535)}
	p.out.Write([]byte{'P', 'A', 'C', 'K', 0, 0, 0, 2, 0, 0, 0, 0}) // the count: Finish's
	return p
}

// Add writes an object of type typ and size bytes, read from body
// (exactly size bytes, else an error), and returns its raw name. After
// an error the pack is unusable.
func (p *PackStream) Add(typ int, size int64, body io.Reader) ([]byte, error) {
	if p.err != nil {
		return nil, p.err
	}
	h := NewHash(p.hexLen)
	fmt.Fprintf(h, "%s %d\x00", TypeName(typ), size)
	e, err := p.out.entry(typ, size, io.TeeReader(body, h), p.buf)
	if err == nil {
		err = p.out.err
	}
	if err != nil {
		p.err = err
		return nil, err
	}
	e.Name = h.Sum(nil)
	p.entries = append(p.entries, e)
	return e.Name, nil
}

// Count is the number of objects added.
func (p *PackStream) Count() int { return len(p.entries) }

// Finish ends the pack: its count in the header, its checksum after the
// last entry. It returns where each object is and the checksum (the
// index's, and the pack's name).
func (p *PackStream) Finish() ([]IndexEntry, []byte, error) {
	if p.err != nil {
		return nil, nil, p.err
	}
	if err := p.bw.Flush(); err != nil {
		return nil, nil, err
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(p.entries)))
	if _, err := p.f.WriteAt(n[:], 8); err != nil {
		return nil, nil, err
	}
	sum := NewHash(p.hexLen)
	if _, err := io.Copy(sum, io.NewSectionReader(p.f, 0, p.out.n)); err != nil {
		return nil, nil, err
	}
	s := sum.Sum(nil)
	if _, err := p.f.Write(s); err != nil {
		return nil, nil, err
	}
	return p.entries, s, nil
}
