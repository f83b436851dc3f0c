package snapshot

import (
	"bytes"
	"context"
	"crypto/sha1"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/gitformat"
)

// emptyStore is a repository with no objects.
type emptyStore struct{}

func (emptyStore) HexLen() int { return 40 }
func (emptyStore) Read(id string, max int64) (int, []byte, error) {
	return 0, nil, fmt.Errorf("%w: %s", gitformat.ErrUnreadable, id)
}
func (emptyStore) HasPacked(string) bool { return false }

// flipReader is a file whose bytes change after its first n full reads
// (a writer the freeze missed).
type flipReader struct {
	b        []byte
	reads, n int
}

func (r *flipReader) ReadAt(p []byte, off int64) (int, error) {
	if off == 0 {
		if r.reads++; r.reads > r.n {
			r.b[0] ^= 0xff
		}
	}
	if off >= int64(len(r.b)) {
		return 0, io.EOF
	}
	n := copy(p, r.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// A file over SmallBlob is read twice (hashed, then into the pack): bytes
// that changed between the reads fail the import, never a pack entry
// named by other bytes than its own. Control: the same file, unchanged,
// is written under the name of its bytes.
func TestAttackABlobThatChangesBetweenItsReads(t *testing.T) {
	for _, stable := range []bool{true, false} {
		f, err := os.CreateTemp(t.TempDir(), "pack")
		if err != nil {
			t.Fatal(err)
		}
		m := NewImport(context.Background(), emptyStore{}, gitformat.NewPackStream(f, 40))
		r := &flipReader{b: bytes.Repeat([]byte("x"), 3*SmallBlob), n: 1}
		if stable {
			r.n = 1 << 30
		}
		want := sha1.Sum(append([]byte(fmt.Sprintf("blob %d\x00", len(r.b))), r.b...))
		id, err := m.blob(int64(len(r.b)), r)
		switch {
		case stable && (err != nil || id != string(want[:])):
			t.Errorf("control: %x, %v; want %x", id, err, want)
		case !stable && (err == nil || !strings.Contains(err.Error(), "changed while it was read")):
			t.Errorf("a blob that changed between its reads: %x, %v", id, err)
		}
		f.Close()
	}
}
