package gitguard

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/internal/testutil"
)

// TestEffectiveIDsCheckAsTheOwnerOnOneThread is ownerDo's way where
// setfsuid is missing (gVisor): the thread's effective ids are the
// owner's, so the kernel refuses what the owner could not do (create in
// root's directory, chmod root's file) and allows what it could (chmod its
// own file); restored, the thread is root with its capabilities again.
// The control: the same operations as root before the take succeed.
func TestEffectiveIDsCheckAsTheOwnerOnOneThread(t *testing.T) {
	testutil.NeedRoot(t)
	dir, err := os.MkdirTemp("", "shim-ids-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	own, roots := filepath.Join(dir, "own"), filepath.Join(dir, "roots")
	for _, f := range []string{own, roots} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(own, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	try := func() (create, chmodOwn, chmodRoots error) {
		fd, err := unix.Open(filepath.Join(dir, "new"), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(fd)
			unix.Unlink(filepath.Join(dir, "new"))
		}
		return err, unix.Chmod(own, 0o640), unix.Chmod(roots, 0o640)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if c, o, r := try(); c != nil || o != nil || r != nil {
			t.Errorf("control, as root: %v %v %v", c, o, r)
		}
		e := &effectiveIDs{}
		if !e.take(1000, 1000) {
			t.Error("take failed")
		}
		c, o, r := try()
		if !errors.Is(c, unix.EACCES) || o != nil || !errors.Is(r, unix.EPERM) {
			t.Errorf("as the owner: create %v (want EACCES), chmod own %v (want nil), chmod root's %v (want EPERM)", c, o, r)
		}
		if !e.restore(0, 0) {
			t.Error("restore failed")
			return // the thread stays locked and ends with this goroutine
		}
		if c, _, r := try(); c != nil || r != nil {
			t.Errorf("restored: %v %v", c, r)
		}
		runtime.UnlockOSThread()
	}()
	<-done
}
