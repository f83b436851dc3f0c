package snapshot

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/testutil"
	"golang.org/x/sys/unix"
)

// The walk hands a layer's files, symlinks and directories to the sink
// depth first, by name; the top's .git is not walked, a nested one (any
// case) is listed, not stored.
func TestWalkOrderAndKinds(t *testing.T) {
	dir := layer(t, map[string]string{
		"b":         "bee",
		"a/z":       "+x run",
		"a/l":       "->../b",
		"a/d/e/":    "",
		".git/HEAD": "ref",
		"c/.GIT/x":  "x",
		"a/d/f.txt": "",
		"a.txt":     "at",
	})
	r := &recSink{}
	skipped, w, err := walkLayer(t, dir, r, 1<<20, Defaults(), false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"enter a false",
		"enter a/d false",
		"enter a/d/e false",
		"leave",
		`put a/d/f.txt 100644 ""`,
		"leave",
		`put a/l 120000 "../b"`,
		`put a/z 100755 "run"`,
		"leave",
		`put a.txt 100644 "at"`,
		`put b 100644 "bee"`,
		"enter c false",
		"leave",
	}
	if !reflect.DeepEqual(r.ev, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(r.ev, "\n"), strings.Join(want, "\n"))
	}
	if len(skipped) != 1 || skipped[0].Path != "c/.GIT" || skipped[0].Type != "nested_git" {
		t.Errorf("not stored: %+v", skipped)
	}
	if w.Peak() < 2 || w.Peak() > MaxOpenDirs {
		t.Errorf("peak descriptors %d", w.Peak())
	}
}

// Fail closed: a FIFO, a socket, a file over the size bound are listed,
// never read or stored; the big file's first bytes are hashed for the
// report.
func TestWalkNotStored(t *testing.T) {
	dir := layer(t, map[string]string{"big": strings.Repeat("x", 100), "small": "s"})
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(dir, "sock"), unix.S_IFSOCK|0o644, 0); err != nil {
		t.Fatal(err)
	}
	r := &recSink{}
	skipped, _, err := walkLayer(t, dir, r, 10, Defaults(), false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{`put small 100644 "s"`}; !reflect.DeepEqual(r.ev, want) {
		t.Errorf("events %q", r.ev)
	}
	types := map[string]string{}
	for _, f := range skipped {
		types[f.Path] = f.Type
		if f.Path == "big" && (f.Size != 100 || f.HashedBytes != 100 ||
			f.Hash != "sha256:"+sha256hex(strings.Repeat("x", 100))) {
			t.Errorf("big: %+v", f)
		}
	}
	if want := map[string]string{"big": "file", "fifo": "fifo", "sock": "socket"}; !reflect.DeepEqual(types, want) {
		t.Errorf("not stored %v, want %v", types, want)
	}
}

// Devices need root: a char device 0/0 is a whiteout, others are listed.
func TestWalkDevicesAsRoot(t *testing.T) {
	testutil.NeedRoot(t) // mknod of a device
	dir := layer(t, map[string]string{"keep": "k"})
	for _, d := range []struct {
		name string
		mode uint32
		dev  int
	}{{"gone", unix.S_IFCHR, 0}, {"null", unix.S_IFCHR, int(unix.Mkdev(1, 3))}, {"blk", unix.S_IFBLK, int(unix.Mkdev(7, 0))}} {
		err := unix.Mknod(filepath.Join(dir, d.name), d.mode|0o600, d.dev)
		testutil.Need(t, err == nil, fmt.Sprintf("mknod %s: %v", d.name, err))
	}
	r := &recSink{}
	skipped, _, err := walkLayer(t, dir, r, 1<<20, Defaults(), false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"remove gone", `put keep 100644 "k"`}; !reflect.DeepEqual(r.ev, want) {
		t.Errorf("events %q", r.ev)
	}
	if len(skipped) != 2 || skipped[0].Type != "block_device" || skipped[1].Type != "char_device" {
		t.Errorf("not stored %+v", skipped)
	}
}

// The walk's bounds: a path too long, a directory too deep (listed only
// when it has entries), too many names, too many fast-import scans.
func TestWalkBounds(t *testing.T) {
	dir := layer(t, map[string]string{
		"a/b/c/deep":    "d",
		"a/b/empty/":    "",
		"longname.file": "l",
		"x":             "x",
	})
	b := Defaults()
	b.Depth, b.Path = 3, 10 // the top counts
	r := &recSink{}
	skipped, _, err := walkLayer(t, dir, r, 1<<20, b, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"enter a false", "enter a/b false", "leave", "leave", `put x 100644 "x"`}; !reflect.DeepEqual(r.ev, want) {
		t.Errorf("events %q", r.ev)
	}
	got := map[string]string{}
	for _, f := range skipped {
		got[f.Path] = f.Type
	}
	if want := map[string]string{"a/b/c": "too_deep", "longname.file": "path_too_long"}; !reflect.DeepEqual(got, want) {
		t.Errorf("not stored %v, want %v", got, want)
	}

	// names: the top's entries past the budget are not walked
	b = Defaults()
	b.Names = 2 * (1 + 16)
	r = &recSink{}
	skipped, _, err = walkLayer(t, dir, r, 1<<20, b, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) == 0 || skipped[0].Path != "." || skipped[0].Type != "too_many_entries" {
		t.Errorf("names bound: %+v", skipped)
	}

	// scans: only for fast-import's stream
	b = Defaults()
	b.Scans = 3
	for _, scanned := range []bool{false, true} {
		r = &recSink{}
		skipped, _, err = walkLayer(t, dir, r, 1<<20, b, scanned)
		if err != nil {
			t.Fatal(err)
		}
		if scanned != (len(skipped) > 0) || scanned && skipped[0].Type != "too_many_entries" {
			t.Errorf("scanned %v: %+v", scanned, skipped)
		}
	}
}

// A directory's too-many-entries bound below the top.
func TestWalkNamesBoundInADirectory(t *testing.T) {
	dir := layer(t, map[string]string{"d/a": "a", "d/b": "b", "d/c": "c"})
	b := Defaults()
	b.Names = (1 + 16) * 3 // "d" and two of d's
	r := &recSink{}
	skipped, _, err := walkLayer(t, dir, r, 1<<20, b, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) != 1 || skipped[0].Path != "d" || skipped[0].Type != "too_many_entries" {
		t.Errorf("not stored %+v", skipped)
	}
	if len(r.ev) != 4 { // enter, two puts, leave
		t.Errorf("events %q", r.ev)
	}
}

// Past OpenDirs the walk closes the directories it will come back to and
// opens them again by path (openat2, or component by component): the
// same changes, at most OpenDirs descriptors.
func TestWalkReopensDirectories(t *testing.T) {
	files := map[string]string{}
	p := ""
	for i := 0; i < 8; i++ {
		p += "d/"
		files[p+"z"] = "z"
		files[p+"a"] = "a"
	}
	dir := layer(t, files)
	var want []string
	for _, byComponents := range []bool{false, true} {
		b := Defaults()
		b.OpenDirs = 3
		r := &recSink{}
		var w *Walk
		skipped := 0
		w = NewWalk(r, 1<<20, b, false, func(api.NotStoredFile) { skipped++ })
		if byComponents {
			w.OpenByComponents()
		}
		if err := w.Run(openDir(t, dir)); err != nil {
			t.Fatal(err)
		}
		if w.Peak() > 3 || skipped != 0 {
			t.Errorf("by components %v: peak %d, %d not stored", byComponents, w.Peak(), skipped)
		}
		if want == nil {
			want = r.ev
		} else if !reflect.DeepEqual(r.ev, want) {
			t.Errorf("by components: %q\nwant %q", r.ev, want)
		}
	}
	if len(want) != 8*4 {
		t.Errorf("%d events: %q", len(want), want)
	}
}

// openBeneath never leaves the top, nor follows a symlink.
func TestOpenBeneath(t *testing.T) {
	dir := layer(t, map[string]string{"d/e/": "", "l": "->d"})
	top := openDir(t, dir)
	for _, noOpenat2 := range []bool{false, true} {
		fd, err := openBeneath(top, "d/e", noOpenat2)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		bad := []string{"l/e", "missing"}
		if !noOpenat2 {
			// component by component, only names the walk read (never
			// "..": ParseDirent drops it) are opened
			bad = append(bad, "../"+filepath.Base(dir))
		}
		for _, bad := range bad {
			if fd, err := openBeneath(top, bad, noOpenat2); err == nil {
				unix.Close(fd)
				t.Errorf("openBeneath(%q, %v) opened", bad, noOpenat2)
			}
		}
	}
	if _, err := openBeneath(top, "", true); err == nil {
		t.Error("openBeneath of the top itself")
	}
}

// The sink's error ends the walk, its descriptors closed.
func TestWalkSinkError(t *testing.T) {
	dir := layer(t, map[string]string{"a/b/c": "c"})
	boom := errors.New("boom")
	_, _, err := walkLayer(t, dir, &recSink{err: boom}, 1<<20, Defaults(), false)
	if !errors.Is(err, boom) {
		t.Errorf("err %v", err)
	}
}

func sha256hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
