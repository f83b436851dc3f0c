package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A write under spare that finds the filesystem full fails and leaves the
// reserve in place; the same write outside spare gives the reserve up and
// succeeds (the control: the reserve is what a fence's token spends).
func TestASparedWriteNeverSpendsTheReserve(t *testing.T) {
	dir := t.TempDir()
	r, err := newReserve(filepath.Join(dir, "reserve"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	full := true // the filesystem, as the write sees it, until the reserve goes
	write := func() error {
		if _, err := os.Stat(r.path); err == nil && full {
			return &os.PathError{Op: "write", Path: "state.json", Err: unix.ENOSPC}
		}
		return nil
	}
	var spared error
	r.spare(func() { spared = r.retry(write) })
	if !errors.Is(spared, unix.ENOSPC) || !r.held {
		t.Fatalf("spared write: %v, reserve held %v", spared, r.held)
	}
	if _, err := os.Stat(r.path); err != nil {
		t.Fatalf("the reserve file is gone after a spared write: %v", err)
	}
	// the control: the same write outside spare succeeds, because the
	// reserve was given up for it (write fails while the file is there)
	if err := r.retry(write); err != nil {
		t.Fatalf("control: the write outside spare failed: %v", err)
	}
}

// release gives the reserve up (its file gone, its bytes free) and ensure
// takes it again; a reserve given up is short, one held on a filesystem
// with room is not.
func TestAReleasedReserveIsTakenAgain(t *testing.T) {
	dir := t.TempDir()
	r := &reserve{path: filepath.Join(dir, "reserve"), size: 1 << 20}
	if !r.short() {
		t.Fatal("a reserve never taken is not short")
	}
	if !r.ensure() || r.heldBytes() < 1<<20 {
		t.Fatalf("ensure: held %v, %d bytes", r.held, r.heldBytes())
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && int64(st.Bavail)*int64(st.Bsize) > 1<<20 && r.short() {
		t.Fatal("a reserve held on a filesystem with room is short")
	}
	r.release()
	if _, err := os.Stat(r.path); !os.IsNotExist(err) || r.heldBytes() != 0 || !r.short() {
		t.Fatalf("after release: file %v, held %d bytes, short %v", err, r.heldBytes(), r.short())
	}
	if !r.ensure() || r.heldBytes() < 1<<20 {
		t.Fatalf("ensure after release: held %v, %d bytes", r.held, r.heldBytes())
	}
	var nilReserve *reserve // no layers: every method is a no-op
	nilReserve.release()
	if nilReserve.short() || nilReserve.heldBytes() != 0 || !nilReserve.ensure() {
		t.Fatal("a nil reserve is not a no-op")
	}
}
