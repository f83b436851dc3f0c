package gitformat

// Deltas (git's Documentation/gitformat-pack.adoc, "Deltified
// representation"): the base's size and the result's, as varints, then
// instructions: copy a range of the base, or insert the next 1 to 127
// bytes.

import (
	"errors"
	"fmt"
)

// ApplyDelta applies delta to base, for a result of at most max bytes.
// It makes git's checks (patch_delta, patch-delta.c): the base is the
// size the delta says; each copy is within the base and the result (a
// size of 0 is 0x10000), each insert within the delta and the result;
// instruction 0 is reserved; the result is exactly the size declared.
// It allocates the declared size only once it is known to be at most max.
func ApplyDelta(base, delta []byte, max int64) ([]byte, error) {
	varint := func() (uint64, bool) { // get_delta_hdr_size, delta.h
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
	if max < 0 || rsize > uint64(max) {
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
