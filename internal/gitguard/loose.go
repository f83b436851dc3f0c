package gitguard

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// The layer's loose objects: each checked against its name as a stream
// (never held whole past a bound), and read again for the pack when its
// bytes were not kept.

// A looseObject is one of the layer's loose objects, checked against its
// name.
type looseObject struct {
	dir, name string // its fan-out directory and file
	typ       int    // its pack type: gitformat.Commit, gitformat.Tree, gitformat.Blob or gitformat.Tag
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
		limit := min(*budget, maxLooseObject)
		var c gitformat.LooseCheck
		if b != nil || st.Size <= looseReadWhole {
			c = gitformat.VerifyLoose(bytes.NewReader(b), d+n, limit, keep, keptLoose)
		} else {
			c = verifyLooseAt(dfd, n, d+n, st.Size, limit, keep)
		}
		*budget -= c.Inflated
		if c.OK {
			o := looseObject{dir: d, name: n, typ: c.Type, size: c.Size}
			if keep != nil && int64(keep.Len()) == c.Size && c.Size <= *kept {
				o.data = keep.Bytes()
				*kept -= c.Size
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

// verifyLooseAt is gitformat.VerifyLoose of object id's file name below
// dfd, of size bytes as fstat said, read as a stream.
func verifyLooseAt(dfd int, name, id string, size, limit int64, keep *bytes.Buffer) gitformat.LooseCheck {
	f, err := openRegularAt(dfd, name)
	if err != nil {
		return gitformat.LooseCheck{}
	}
	defer f.Close()
	return gitformat.VerifyLoose(bufio.NewReaderSize(io.LimitReader(f, size), 32<<10), id, limit, keep, keptLoose)
}
