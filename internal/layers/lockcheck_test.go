package layers

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// A lower's lock that cannot be confirmed is not a lock: CheckLower fails
// for a lower never locked, and for one whose mounts are not the ones
// locked (here plain directories: no read-only mount of its own, no view
// that is the checkout). No mount, no root.
func TestALockThatCannotBeConfirmedFailsTheCheck(t *testing.T) {
	dir := t.TempDir()
	wt, other := filepath.Join(dir, "wt"), filepath.Join(dir, "other")
	os.Mkdir(wt, 0o755)
	os.Mkdir(other, 0o755)
	l := New(Config{Dir: filepath.Join(dir, "layers")})
	if err := l.CheckLower(wt); err == nil || !strings.Contains(err.Error(), "is not locked") {
		t.Fatalf("never locked: %v", err)
	}
	for name, view := range map[string]string{
		"its view is gone":            filepath.Join(dir, "missing"),
		"its view is another dir":     other,
		"it is its own view, no lock": wt,
	} {
		t.Run(name, func(t *testing.T) {
			l.mu.Lock()
			l.locks[wt] = lowerLock{view: view, lockMnt: 1, viewMnt: 2}
			l.mu.Unlock()
			if err := l.CheckLower(wt + "/"); err == nil {
				t.Fatal("confirmed a lock that is not there")
			}
			if _, err := inspectLock(wt, view); err == nil {
				t.Fatal("inspectLock confirmed it")
			}
		})
	}
	if _, err := inspectLock(filepath.Join(dir, "missing"), wt); err == nil {
		t.Error("a lower that is not there")
	}
}

// UnlockLower of a lower this shim never locked does nothing (the
// sandbox lost its layers before the worktree was locked).
func TestUnlockingALowerNeverLockedDoesNothing(t *testing.T) {
	l := New(Config{Dir: t.TempDir()})
	if err := l.UnlockLower("/never/locked"); err != nil {
		t.Fatal(err)
	}
}

// A remount keeps the flags the mount had: each statfs flag maps to its
// mount flag, and nothing else is added.
func TestARemountKeepsTheMountsFlags(t *testing.T) {
	for st, want := range map[int64]uintptr{
		0:                                 0,
		unix.ST_NOSUID:                    unix.MS_NOSUID,
		unix.ST_NODEV | unix.ST_NOEXEC:    unix.MS_NODEV | unix.MS_NOEXEC,
		unix.ST_NOATIME | unix.ST_RDONLY:  unix.MS_NOATIME,
		unix.ST_NODIRATIME:                unix.MS_NODIRATIME,
		unix.ST_RELATIME | unix.ST_NOSUID: unix.MS_RELATIME | unix.MS_NOSUID,
	} {
		if got := keptFlags(st); got != want {
			t.Errorf("statfs flags %#x: %#x, want %#x", st, got, want)
		}
	}
}

// passable says which directory on the way down to a view keeps a
// process of a uid and group out, nil when none does; root passes all.
func TestPassableNamesTheDirectoryThatKeepsAProcessOut(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	owner, group := uint32(os.Getuid()), uint32(os.Getgid())
	closed := filepath.Join(base, "closed")
	os.Mkdir(closed, 0o750)
	os.Chmod(closed, 0o750)
	target := filepath.Join(closed, "view")
	other := owner + 1000
	for _, tc := range []struct {
		name           string
		uid, gid, supp uint32
		ok             bool
	}{
		{name: "root", uid: 0, gid: 0, ok: true},
		{name: "the owner", uid: owner, gid: other, ok: owner != 0},
		{name: "the group", uid: other, gid: group, ok: true},
		{name: "the supplementary group", uid: other, gid: other, supp: group, ok: true},
		{name: "anyone else", uid: other, gid: other + 1, supp: other + 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.uid == owner && owner == 0 {
				t.Skip("the owner is root here")
			}
			err := passable(target, tc.uid, tc.gid, tc.supp)
			if (err == nil) != tc.ok {
				t.Fatalf("passable: %v, want ok %v", err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), closed+" (mode 750") {
				t.Errorf("the error does not name the closed directory: %v", err)
			}
		})
	}
	if err := passable(filepath.Join(base, "missing", "view"), 0, 0, 0); err == nil {
		t.Error("a path that is not there")
	}
}

// The views' dir must be root's and the lower group's, mode 0750.
func TestTheViewsDirIsRootsAndTheLowerGroupsOnly(t *testing.T) {
	dir := t.TempDir()
	l := New(Config{Dir: dir, LowerGroup: uint32(os.Getgid())})
	if l.viewDirOK() {
		t.Fatal("no views dir")
	}
	os.Mkdir(l.lowerDir(), 0o750)
	os.Chmod(l.lowerDir(), 0o750)
	if got, want := l.viewDirOK(), os.Getuid() == 0; got != want {
		t.Fatalf("a 0750 dir owned by uid %d: ok %v, want %v", os.Getuid(), got, want)
	}
	os.Chmod(l.lowerDir(), 0o755)
	if l.viewDirOK() {
		t.Fatal("a views dir others may enter")
	}
}

// Locking a lower binds its view first (while the checkout is still
// writable), then the checkout on itself, read-only with the checkout's
// own flags; a lock that cannot be made or then confirmed is undone and
// an error: the worktree is refused, never used half-locked.
func TestALockThatCannotBeMadeOrConfirmedIsUndone(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fail     string
		undone   []string // unmounts, in order
		notAfter string   // no call from here on
	}{
		{name: "the view cannot be bound", fail: "bind {wt} {view}", notAfter: "bind {wt} {wt}"},
		{name: "the checkout cannot be bound on itself", fail: "bind {wt} {wt}", undone: []string{"unmount {view}"}, notAfter: "remount-ro"},
		{name: "it cannot be made read-only", fail: "remount-ro", undone: []string{"unmount {wt}", "unmount {view}"}},
		{name: "the lock is not confirmed (no real mounts)", undone: []string{"unmount {wt}", "unmount {view}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := useFakeKernel(t)
			dir := t.TempDir()
			wt := filepath.Join(dir, "wt")
			os.Mkdir(wt, 0o755)
			l := New(Config{Dir: filepath.Join(dir, "layers"), LowerGroup: 4242})
			defer l.Release()
			view := l.LowerView(wt)
			r := strings.NewReplacer("{wt}", wt, "{view}", view)
			if tc.fail != "" {
				k.fail[r.Replace(tc.fail)] = errFake
			}
			if _, err := l.LockLower(wt); err == nil || !strings.Contains(err.Error(), "lock the lower "+wt) {
				t.Fatalf("error %v", err)
			}
			calls := []string{"chown " + l.lowerDir() + " 0:4242", "bind " + wt + " " + view}
			if tc.fail != "bind {wt} {view}" {
				calls = append(calls, "bind "+wt+" "+wt)
			}
			if tc.fail == "" || tc.fail == "remount-ro" {
				calls = append(calls, "remount-ro "+wt)
			}
			for _, u := range tc.undone {
				calls = append(calls, r.Replace(u))
			}
			k.inOrder(t, calls...)
			if tc.notAfter != "" {
				k.never(t, r.Replace(tc.notAfter))
			}
			if err := l.CheckLower(wt); err == nil {
				t.Error("a lock that was undone is confirmed")
			}
			if st, _ := os.Stat(l.lowerDir()); st == nil || st.Mode().Perm() != 0o750 {
				t.Errorf("the views' dir: %v", st)
			}
		})
	}
}

// Unlocking a locked lower detaches the lock and the view and forgets
// them; an unlock the kernel refuses keeps the lock (and says so).
func TestUnlockingALowerDetachesItAndItsView(t *testing.T) {
	k := useFakeKernel(t)
	dir := t.TempDir()
	l := New(Config{Dir: filepath.Join(dir, "layers")})
	wt := filepath.Join(dir, "wt")
	view := l.LowerView(wt)
	k.mounted[view], k.mounted[wt] = true, true
	l.locks[wt] = lowerLock{view: view}
	k.fail["unmount "+wt] = errFake
	if err := l.UnlockLower(wt); err == nil {
		t.Fatal("an unlock the kernel refused")
	}
	if _, ok := l.locks[wt]; !ok {
		t.Fatal("a lock still in place was forgotten")
	}
	delete(k.fail, "unmount "+wt)
	if err := l.UnlockLower(wt + "/"); err != nil {
		t.Fatal(err)
	}
	k.inOrder(t, "unmount "+wt, "unmount "+view)
	if _, ok := l.locks[wt]; ok || k.mounted[view] {
		t.Fatal("the lock or its view is left")
	}
}
