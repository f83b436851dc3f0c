package gitformat

import (
	"bytes"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"sync"
)

// inflaters keeps zlib readers for the next stream: a new one clears its
// 32 KiB window, most of what checking a small object costs.
var inflaters sync.Pool

// inflater is a zlib reader of r, from inflaters when one is there; give
// it back with inflaters.Put.
func inflater(r io.Reader) (io.ReadCloser, error) {
	if z, ok := inflaters.Get().(io.ReadCloser); ok {
		if err := z.(zlib.Resetter).Reset(r, nil); err == nil {
			return z, nil
		}
	}
	return zlib.NewReader(r)
}

// inflateExact inflates the zlib stream at the start of z, which must
// hold exactly size bytes (a pack entry's declared size, which the caller
// has bounded: this allocates size bytes); its checksum is checked.
func inflateExact(z []byte, size int) ([]byte, error) {
	return inflateExactFrom(bytes.NewReader(z), size)
}

// inflateExactFrom is inflateExact of the stream r reads.
func inflateExactFrom(r io.Reader, size int) ([]byte, error) {
	zr, err := inflater(r)
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

// inflateAll inflates the zlib stream z, at most max bytes (a zlib bomb
// costs max+1 bytes, then an error).
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
