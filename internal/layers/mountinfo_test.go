package layers

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// mountinfo as the kernel writes it (proc(5)): optional fields before
// the separator, octal escapes in paths; lines too short or without a
// separator are skipped, not guessed at.
func TestMountinfoIsParsedAsTheKernelWritesIt(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	lines := []string{
		"27 1 0:25 / / rw,relatime shared:1 - overlay overlay rw,lowerdir=/l",
		"22 27 0:5 / /proc rw,nosuid - proc proc rw",
		"24 27 0:6 / /dev rw,nosuid shared:2 master:3 - tmpfs tmpfs rw,mode=755",
		"25 24 0:7 / /dev/mqueue rw - mqueue mqueue rw",
		`46 27 8:1 /src /w\040space rw,relatime - ext4 /dev/sda1 rw`,
		"47 27 8:1 / /short rw",                        // too short
		"48 27 8:1 / /nosep rw,relatime a b c d e f g", // no separator
		"49 27 8:1 / /sepatend rw relatime a b c d -",  // nothing after it
	}
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ms, err := readMountinfo(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []mountEntry{
		{id: "27", parent: "1", point: "/", fstype: "overlay"},
		{id: "22", parent: "27", point: "/proc", fstype: "proc"},
		{id: "24", parent: "27", point: "/dev", fstype: "tmpfs"},
		{id: "25", parent: "24", point: "/dev/mqueue", fstype: "mqueue"},
		{id: "46", parent: "27", point: "/w space", fstype: "ext4"},
	}
	if !reflect.DeepEqual(ms, want) {
		t.Fatalf("got %+v\nwant %+v", ms, want)
	}
	if !isTopLevel(ms[1], ms) || isTopLevel(ms[3], ms) {
		t.Error("isTopLevel")
	}
	if _, err := readMountinfo(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing mountinfo")
	}
}

// An escape that is not three octal digits stays as it is.
func TestAnIncompleteEscapeStaysAsItIs(t *testing.T) {
	for in, want := range map[string]string{`/a\04`: `/a\04`, `/a\xyz`: `/a\xyz`, `/plain`: `/plain`, `\134`: `\`} {
		if got := unescapeMount(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// What the sandbox had mounted right below a mount a fresh tmpfs
// replaces comes back, outermost first, once each; not another fresh one
// nor a hidden one (the layers dir).
func TestMountsBelowAFreshTmpfsAreCarriedOver(t *testing.T) {
	ms := []mountEntry{
		{id: "30", parent: "27", point: "/tmp"},
		{id: "31", parent: "30", point: "/tmp/a/deep"},
		{id: "32", parent: "30", point: "/tmp/w"},
		{id: "33", parent: "30", point: "/tmp/w"},                 // stacked: once
		{id: "34", parent: "30", point: "/tmp/layers/root/1"},     // hidden
		{id: "35", parent: "30", point: "/dev/shm"},               // fresh itself
		{id: "36", parent: "27", point: "/var/lib"},               // not below a fresh one
		{id: "37", parent: "31", point: "/tmp/a/deep/submount"},   // below a carried one: comes with it
		{id: "38", parent: "40", point: "/var/tmp/x"},             // parent not fresh
		{id: "39", parent: "30", point: "/tmp/layers"},            // the hidden dir itself
		{id: "41", parent: "30", point: "/tmp/layersx/notHidden"}, // a sibling's name
	}
	fresh := map[string]bool{"30": true}
	var got []string
	for _, m := range carriedMounts(ms, fresh, []string{"/tmp/layers"}) {
		got = append(got, m.id+" "+m.point)
	}
	want := []string{"32 /tmp/w", "31 /tmp/a/deep", "41 /tmp/layersx/notHidden"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if !contains(freshTmpfs, "/dev/shm") || contains(freshTmpfs, "/dev") {
		t.Error("contains")
	}
}

// A stub given arguments it cannot use refuses before it mounts
// anything: it never runs a harness on a half-made view.
func TestAStubWithBadArgumentsRefusesBeforeMounting(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"{}", "/bin/true"}, // no argv
		{"{not json", "/bin/true", "true"},
		{"fd:2"}, // not a socket of its own
		{"fd:x"},
	} {
		if got := RunStub(args); got != 127 {
			t.Errorf("%q: exit %d, want 127", args, got)
		}
	}
	if truncate([]byte("abcdef"), 3) != "abc..." || truncate([]byte("ab"), 3) != "ab" {
		t.Error("truncate")
	}
}
