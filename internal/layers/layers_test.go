package layers

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"reflect"
	goruntime "runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/internal/testutil"
)

func TestTopLevelBindsEachMountBelowTheRootOnceOutermostFirst(t *testing.T) {
	ms := []mountEntry{
		{id: "22", parent: "27", point: "/proc"},
		{id: "24", parent: "27", point: "/dev"},
		{id: "25", parent: "24", point: "/dev/shm"},
		{id: "27", parent: "1", point: "/"},
		{id: "45", parent: "27", point: "/var/lib/docker"},
		{id: "46", parent: "27", point: "/w"},
		{id: "47", parent: "27", point: "/w"}, // stacked: the later one is what the sandbox sees
	}
	var got []string
	for _, m := range topLevel(ms) {
		got = append(got, m.id+" "+m.point)
	}
	want := []string{"22 /proc", "24 /dev", "47 /w", "45 /var/lib/docker"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestMountinfoEscapesAreUndone(t *testing.T) {
	if got := unescapeMount(`/a\040b\011c`); got != "/a b\tc" {
		t.Errorf("%q", got)
	}
	if got := escapeOpt(`/a,b:c\d`); got != `/a\,b\:c\\d` {
		t.Errorf("%q", got)
	}
}

func TestUnderMatchesWholeComponentsOnly(t *testing.T) {
	if !under("/var/lib/shim/layers/root", []string{"/var/lib/shim/layers"}) || under("/var/lib/shim/layers2", []string{"/var/lib/shim/layers"}) {
		t.Error("under")
	}
}

// Prune keeps the Keep newest fenced generations, every live one and
// everything at or above the current one.
func TestPruneKeepsTheNewestFencedLiveAndCurrentLayers(t *testing.T) {
	dir := t.TempDir()
	l := New(Config{Dir: dir, Keep: 1})
	for _, g := range []string{"1", "2", "3", "4", "5"} {
		for _, d := range []string{filepath.Join(dir, "root", g), filepath.Join(dir, "wt", "k", g)} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
	}
	live := func(n uint64) bool { return n == 1 } // a failed fence: its layer is still needed
	if err := l.Prune(4, live); err != nil {
		t.Fatal(err)
	}
	for g, want := range map[string]bool{"1": true, "2": false, "3": true, "4": true, "5": true} {
		for _, d := range []string{filepath.Join(dir, "root", g), filepath.Join(dir, "wt", "k", g)} {
			if _, err := os.Stat(d); (err == nil) != want {
				t.Errorf("%s kept=%v, want %v", d, err == nil, want)
			}
		}
	}
}

// KeepBytes bounds the kept layers in all: the oldest go first, even
// within Keep; a pinned layer is never removed.
func TestPruneKeepsNoMoreThanKeepBytes(t *testing.T) {
	dir := t.TempDir()
	l := New(Config{Dir: dir, Keep: 3, KeepBytes: 9 << 19}) // 4.5 MiB
	write := func(g string, size int) {
		d := filepath.Join(dir, "wt", "k", g, "upper")
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, size)
		rand.Read(b) // blocks on disk even where a filesystem compresses
		if err := os.WriteFile(filepath.Join(d, "f"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dir, "root", g), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []string{"1", "2", "3", "4", "5"} {
		write(g, 1<<20+1<<19) // 1.5 MiB each: two fit in 3 MiB, not three
	}
	if err := l.Pin(1, "a test"); err != nil {
		t.Fatal(err)
	}
	if err := l.Prune(5, func(uint64) bool { return false }); err != nil {
		t.Fatal(err)
	}
	// 5 is current; 4 and 3 are the newest fenced ones, within Keep, but
	// 1 is pinned (kept whatever it takes) and its 1.5 MiB count against
	// the bound first: with 4's, 3 MiB; with 3's too, 4.5 MiB and their
	// directories' blocks: 3 goes.
	for g, want := range map[string]bool{"1": true, "2": false, "3": false, "4": true, "5": true} {
		if _, err := os.Stat(filepath.Join(dir, "wt", "k", g)); (err == nil) != want {
			t.Errorf("generation %s's layer kept=%v, want %v", g, err == nil, want)
		}
	}
}

// privateMounts puts the test's goroutine, locked to its thread for good,
// in a mount namespace of its own with private mounts: what it mounts goes
// away with the thread.
func privateMounts(t *testing.T) {
	t.Helper()
	goruntime.LockOSThread() // never unlocked: the thread exits with the test's goroutine
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatal(err)
	}
}

func TestTheUpperOfALayerHasItsLowersOwnerAndMode(t *testing.T) {
	testutil.NeedRoot(t)
	dir := t.TempDir()
	wt := filepath.Join(dir, "wt")
	if err := os.Mkdir(wt, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(wt, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	l := New(Config{Dir: filepath.Join(dir, "layers")})
	privateMounts(t) // NewPlan mounts the root layers' tmpfs: never in the host's namespace
	defer l.Release()
	p, err := l.NewPlan(7, []string{wt})
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p.Worktrees[0].Upper)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o750 || p.Worktrees[0].Upper != l.WorktreeUpper(wt, 7) {
		t.Errorf("upper %s mode %v", p.Worktrees[0].Upper, st.Mode())
	}
	parent, _ := os.Stat(filepath.Dir(p.Worktrees[0].Upper))
	if parent.Mode().Perm() != 0o700 {
		t.Errorf("the layer's dir is %v, want 0700", parent.Mode().Perm())
	}
}

// A filesystem with less room than MinFree loses the fenced generations'
// kept layers (all of them here: no filesystem has 2^62 bytes free), never
// a pinned or a live one; the control, without MinFree, keeps Keep of them.
func TestPruneFreesRoomWhenTheFilesystemIsShort(t *testing.T) {
	for _, minFree := range []int64{0, 1 << 62} {
		dir := t.TempDir()
		l := New(Config{Dir: dir, Keep: 2, MinFree: minFree})
		for _, g := range []string{"1", "2", "3", "4", "5"} {
			if err := os.MkdirAll(filepath.Join(dir, "wt", "k", g, "upper"), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Pin(1, "a test"); err != nil {
			t.Fatal(err)
		}
		live := func(n uint64) bool { return n == 2 }
		if err := l.Prune(5, live); err != nil {
			t.Fatal(err)
		}
		short := minFree > 0
		for g, want := range map[string]bool{"1": true, "2": true, "3": !short, "4": !short, "5": true} {
			if _, err := os.Stat(filepath.Join(dir, "wt", "k", g)); (err == nil) != want {
				t.Errorf("MinFree %d: generation %s's layer kept=%v, want %v", minFree, g, err == nil, want)
			}
		}
	}
}
