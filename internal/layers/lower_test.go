package layers

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/internal/testutil"
)

// TestLockLowerMakesTheCheckoutReadOnlyButToShim locks a checkout owned by
// an unprivileged uid in a mount namespace of the test's: its path refuses
// every write (the owner's and root's), the view takes shim's and the view's
// group's, and is closed to the owner without the group. The control is the
// same owner's write before the lock.
func TestLockLowerMakesTheCheckoutReadOnlyButToShim(t *testing.T) {
	testutil.NeedRoot(t)
	testutil.NeedTool(t, "setpriv")
	const uid, group = 65534, 65533
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	wt := filepath.Join(dir, "wt")
	if err := os.MkdirAll(filepath.Join(wt, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.ChownR(t, wt, uid)
	l := New(Config{Dir: filepath.Join(dir, "layers"), LowerGroup: group})
	privateMounts(t)
	defer l.Release()
	t.Cleanup(func() { unmount(wt); unmount(l.LowerView(wt)) }) // before the temp dir's removal
	as := func(groups string, script string) error {
		args := []string{"--reuid", strconv.Itoa(uid), "--regid", strconv.Itoa(uid)}
		if groups == "" {
			args = append(args, "--clear-groups")
		} else {
			args = append(args, "--groups", groups)
		}
		cmd := exec.Command("setpriv", append(args, "sh", "-c", script)...)
		cmd.Dir = "/"
		out, err := cmd.CombinedOutput()
		if err != nil {
			return errors.New(strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := as("", "echo before > "+wt+"/a"); err != nil {
		t.Fatalf("control: the owner cannot write its checkout before the lock: %v", err)
	}
	view, err := l.LockLower(wt)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.CheckLower(wt); err != nil {
		t.Fatalf("the lock just made is not confirmed: %v", err)
	}
	if again, err := l.LockLower(wt); err != nil || again != view {
		t.Fatalf("locking again: %q %v", again, err)
	}
	if err := as("", "echo after >> "+wt+"/a"); err == nil || !strings.Contains(err.Error(), "Read-only") {
		t.Errorf("the owner wrote the locked checkout: %v", err)
	}
	if err := os.WriteFile(filepath.Join(wt, "b"), nil, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("root wrote the locked checkout's path: %v", err)
	}
	if err := as("", "echo after >> "+view+"/a"); err == nil {
		t.Errorf("the owner without the view's group wrote through the view")
	}
	if err := as(strconv.Itoa(group), "echo view >> "+view+"/a"); err != nil {
		t.Errorf("the owner with the view's group (shim's git) cannot write through the view: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(wt, "a")); string(b) != "before\nview\n" {
		t.Errorf("the checkout holds %q", b)
	}
	// A lock that is gone (a root process outside shim unmounted it) is
	// not confirmed.
	if err := unix.Unmount(wt, 0); err != nil {
		t.Fatal(err)
	}
	if err := l.CheckLower(wt); err == nil {
		t.Error("CheckLower confirmed a lock that is gone")
	}
	if _, err := l.LockLower(wt); err != nil {
		t.Fatal(err)
	}
	if err := l.CheckLower(wt); err != nil {
		t.Errorf("the lock made again is not confirmed: %v", err)
	}
}
