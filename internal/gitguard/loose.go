package gitguard

import (
	"bufio"
	"bytes"
	"compress/zlib"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The layer's loose objects: each checked against its name as a stream
// (never held whole past a bound), and read again for the pack when its
// bytes were not kept.

// A looseObject is one of the layer's loose objects, checked against its
// name.
type looseObject struct {
	dir, name string // its fan-out directory and file
	typ       int    // its pack type: objCommit, objTree, objBlob or objTag
	size      int64
	data      []byte // its bytes, kept from the check while they fit in keptLoose (else read again)
}

// keptLoose bounds the bytes of loose objects held in memory between
// their check and the pack (the rest is read again, and a history whose
// commits and trees were not all kept is git's to check). A loose file
// over looseReadWhole bytes is checked as a stream, never held whole.
const (
	keptLoose      = 4 << 20
	looseReadWhole = 1 << 20
)

// verifyLoose checks the loose objects of one fan-out directory. Each is
// inflated as a stream into its hash, its header read first: an object
// whose header claims more than maxLooseObject bytes, or that inflates to
// more than it claims, or whose name is not its hash, is left out, and
// the inflated bytes count against the budget (a zlib bomb costs the
// budget, not shim's memory).
func verifyLoose(ofd int, d string, hexLen int, budget, kept *int64) []looseObject {
	dfd, err := openDirAt(ofd, d)
	if err != nil {
		return nil
	}
	defer unix.Close(dfd)
	names, _ := readDirNames(dfd)
	sort.Strings(names)
	var ok []looseObject
	for _, n := range names {
		if !isHex(n) || len(n) != hexLen-2 || *budget <= 0 {
			continue
		}
		// A small one is read whole (one read), a larger one as a stream
		// (never held: a harness's 64 MiB object costs shim no memory).
		b, st, err := readFileAt(dfd, n, min(*budget, maxLooseObject, looseReadWhole))
		if err != nil && st.Mode&unix.S_IFMT == unix.S_IFREG && st.Size > looseReadWhole {
			err = nil
		}
		if err != nil || st.Size > *budget || st.Size > maxLooseObject {
			continue
		}
		*budget -= st.Size
		var keep *bytes.Buffer
		if *kept > 0 {
			keep = &bytes.Buffer{}
		}
		var typ int
		var size, inflated int64
		var good bool
		if b != nil || st.Size <= looseReadWhole {
			typ, size, good, inflated = looseMatches(b, d+n, *budget, keep)
		} else {
			typ, size, good, inflated = looseMatchesAt(dfd, n, st.Size, d+n, *budget, keep)
		}
		*budget -= inflated
		if good {
			o := looseObject{dir: d, name: n, typ: typ, size: size}
			if keep != nil && int64(keep.Len()) == size && size <= *kept {
				o.data = keep.Bytes()
				*kept -= size
			}
			ok = append(ok, o)
		}
	}
	return ok
}

// packLoose writes the checked loose objects as one pack (each object
// whole, none a delta) into index-pack, which checks every object again
// and adds the pack to the repository: one pack, not a file per object
// (writing hundreds of files costs a fence tens of milliseconds, and far
// more on a FUSE filesystem such as a container's fuse-overlayfs root).
// The pack is written as the repository's owner, by git, so that the
// next generation's harness can add objects of its own beside it.
func (g *Guard) packLoose(ctx context.Context, ofd int, objs []looseObject, hexLen int) error {
	if len(objs) == 0 {
		return nil
	}
	pr, pw := io.Pipe()
	go func() {
		_, _, err := writePack(pw, ofd, objs, hexLen)
		pw.CloseWithError(err)
	}()
	_, err := g.git(ctx, gitOpts{stdin: pr}, "index-pack", "--stdin")
	pr.CloseWithError(errors.New("index-pack ended"))
	if err != nil {
		return fmt.Errorf("pack the harness's loose objects: %w", err)
	}
	return nil
}

// looseMatches reports whether b, a zlib-compressed loose object, has a
// valid header for at most maxLooseObject bytes, inflates to exactly
// that and hashes to id (SHA-1 or SHA-256 by its length), reading at most
// budget inflated bytes; it returns the object's pack type and size, and
// how many bytes it inflated. keep, if set, receives the object's bytes.
func looseMatches(b []byte, id string, budget int64, keep *bytes.Buffer) (typ int, size int64, ok bool, inflated int64) {
	return looseMatchesFrom(bytes.NewReader(b), id, budget, keep)
}

// looseMatchesAt is looseMatches of the file name below dfd, of size
// bytes (as fstat said), read as a stream.
func looseMatchesAt(dfd int, name string, size int64, id string, budget int64, keep *bytes.Buffer) (int, int64, bool, int64) {
	f, err := openRegularAt(dfd, name)
	if err != nil {
		return 0, 0, false, 0
	}
	defer f.Close()
	return looseMatchesFrom(bufio.NewReaderSize(io.LimitReader(f, size), 32<<10), id, budget, keep)
}

// openRegularAt opens name below dfd to read, not following a symlink,
// and only if it is a regular file.
func openRegularAt(dfd int, name string) (*os.File, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &os.PathError{Op: "openat", Path: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, errNotRegular)
	}
	return f, nil
}

// openLoose opens loose object dir/name below lfd (a layer's objects
// dir) to be read again, as a stream: its inflated bytes, and the file
// to close.
func openLoose(lfd int, dir, name string) (io.Reader, *os.File, error) {
	dfd, err := openDirAt(lfd, dir)
	if err != nil {
		return nil, nil, err
	}
	f, err := openRegularAt(dfd, name)
	unix.Close(dfd)
	if err != nil {
		return nil, nil, err
	}
	zr, err := zlib.NewReader(bufio.NewReaderSize(io.LimitReader(f, maxLooseObject), 32<<10))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return zr, f, nil
}

// looseMatchesFrom is looseMatches of the compressed bytes r reads.
func looseMatchesFrom(r io.Reader, id string, budget int64, keep *bytes.Buffer) (typ int, size int64, ok bool, inflated int64) {
	zr, err := inflater(r)
	if err != nil {
		return 0, 0, false, 0
	}
	defer inflaters.Put(zr)
	br := bufio.NewReaderSize(zr, 64)
	hdr, err := br.ReadString(0)
	if err != nil || len(hdr) > 32 {
		return 0, 0, false, int64(len(hdr))
	}
	f := strings.Fields(strings.TrimSuffix(hdr, "\x00"))
	if len(f) != 2 {
		return 0, 0, false, int64(len(hdr))
	}
	if typ = objectType(f[0]); typ == 0 {
		return 0, 0, false, int64(len(hdr))
	}
	size, err = strconv.ParseInt(f[1], 10, 64)
	if err != nil || size < 0 || size > maxLooseObject || size > budget {
		return 0, 0, false, int64(len(hdr))
	}
	// Only git's own header ("blob 5"): the pack gives the object that
	// header, and a name hashed over another one ("blob +5", "blob 05",
	// two spaces) is not the name index-pack gives it.
	if hdr != f[0]+" "+strconv.FormatInt(size, 10)+"\x00" {
		return 0, 0, false, int64(len(hdr))
	}
	h := objectHash(len(id))
	h.Write([]byte(hdr))
	var dst io.Writer = h
	if keep != nil && size <= keptLoose { // kept up to keptLoose and one more; a bigger one is read again
		dst = io.MultiWriter(h, keep)
	}
	n, err := io.Copy(dst, io.LimitReader(br, size+1))
	if err != nil || n != size {
		return 0, 0, false, int64(len(hdr)) + n
	}
	return typ, size, hex.EncodeToString(h.Sum(nil)) == id, int64(len(hdr)) + n
}

// inflaters keeps zlib readers for the next loose object: a new one
// clears its 32 KiB window, most of what checking a small object costs.
var inflaters sync.Pool

// inflater is a zlib reader of r, from inflaters when one is there.
func inflater(r io.Reader) (io.ReadCloser, error) {
	if z, ok := inflaters.Get().(io.ReadCloser); ok {
		if err := z.(zlib.Resetter).Reset(r, nil); err == nil {
			return z, nil
		}
	}
	return zlib.NewReader(r)
}
