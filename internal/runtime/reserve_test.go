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
