package layers

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// A generation's layers are laid out on the fake kernel: the root layer
// on a tmpfs of its own (size and inodes bounded), its upper given the
// root's owner; each worktree's layer a fresh directory on the layers
// dir, or, bounded, a tmpfs of its own with room kept for the snapshot's
// marker; the layers dir hidden from the generation, the shared paths
// bound in.
func TestAPlanLaysOutEachLayer(t *testing.T) {
	for _, bounded := range []bool{false, true} {
		t.Run(fmt.Sprintf("bounded=%v", bounded), func(t *testing.T) {
			k := useFakeKernel(t)
			dir, wt := t.TempDir(), t.TempDir()
			cfg := Config{Dir: dir, RootSize: 8 << 20, Bind: []string{"/run/shim"}, Persist: []string{"/cache"}}
			if bounded {
				cfg.WorktreeSize = 4 << 20
			}
			l := New(cfg)
			defer l.Release()
			p, err := l.NewPlan(7, []string{wt + "/"})
			if err != nil {
				t.Fatal(err)
			}
			rd := filepath.Join(dir, "root", "7")
			if !reflect.DeepEqual(p.Root, &RootLayer{Upper: rd + "/upper", Work: rd + "/work", Merged: rd + "/merged"}) {
				t.Errorf("root %+v", p.Root)
			}
			w := p.Worktrees[0]
			if w.Path != wt || w.Upper != l.WorktreeUpper(wt, 7) || w.Work != filepath.Join(filepath.Dir(w.Upper), "work") {
				t.Errorf("worktree layer %+v", w)
			}
			if !reflect.DeepEqual(p.Hide, []string{dir}) || !reflect.DeepEqual(p.Bind, []string{"/run/shim", "/cache"}) {
				t.Errorf("hide %v bind %v", p.Hide, p.Bind)
			}
			var st os.FileInfo
			if st, err = os.Stat(wt); err != nil {
				t.Fatal(err)
			}
			owner := fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
			calls := []string{"tmpfs " + rd + " mode=0700,size=8388608,nr_inodes=2048", "chown " + rd + "/upper 0:0"}
			marker, merr := os.ReadFile(filepath.Join(filepath.Dir(w.Upper), "snapshot"))
			if bounded {
				calls = append(calls, "tmpfs "+filepath.Dir(w.Upper)+" mode=0700,size=4194304,nr_inodes=1024")
				if merr != nil || len(marker) != 4096 || len(bytes.TrimSpace(marker)) != 0 {
					t.Errorf("a bounded layer keeps a page of blank lines for the marker: %d bytes, %v", len(marker), merr)
				}
			} else if merr == nil {
				t.Error("an unbounded layer has no marker before its snapshot")
			}
			k.inOrder(t, append(calls, "chown "+w.Upper+" "+owner)...)
			if up, err := os.Stat(w.Upper); err != nil || up.Mode().Perm() != st.Mode().Perm() {
				t.Errorf("the upper's mode is not its lower's: %v %v", up, err)
			}
			for _, d := range []string{p.Root.Upper, p.Root.Work, p.Root.Merged, w.Work} {
				if st, err := os.Stat(d); err != nil || !st.IsDir() {
					t.Errorf("%s not made: %v", d, err)
				}
			}
		})
	}
}

// What an earlier attempt of the same generation left (its start failed
// half-way) is detached and emptied before the layer is made again.
func TestAPlanStartsFromEmptyLayers(t *testing.T) {
	k := useFakeKernel(t)
	dir := t.TempDir()
	l := New(Config{Dir: dir})
	defer l.Release()
	rd := filepath.Join(dir, "root", "3")
	os.MkdirAll(filepath.Join(rd, "upper"), 0o700)
	os.WriteFile(filepath.Join(rd, "upper", "left"), []byte("x"), 0o600)
	k.mounted[rd] = true
	if _, err := l.NewPlan(3, nil); err != nil {
		t.Fatal(err)
	}
	k.inOrder(t, "unmount "+rd, "tmpfs "+rd)
	if _, err := os.Stat(filepath.Join(rd, "upper", "left")); err == nil {
		t.Fatal("the earlier attempt's file is in the new layer")
	}
}

// A layer that cannot be made fails the plan: nothing is returned that a
// stub could mount.
func TestAPlanWhoseLayersCannotBeMadeFails(t *testing.T) {
	for _, tc := range []struct {
		name, fail string
		bounded    bool
	}{
		{name: "the root layer's tmpfs", fail: "tmpfs"},
		{name: "the root upper's owner", fail: "chown"},
		{name: "the worktree layer's tmpfs", fail: "tmpfs /", bounded: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := useFakeKernel(t)
			dir, wt := t.TempDir(), t.TempDir()
			l := New(Config{Dir: dir})
			if tc.bounded {
				l = New(Config{Dir: dir, WorktreeSize: 1 << 20})
				k.fail["tmpfs "+filepath.Join(dir, "wt")] = errFake
			} else {
				k.fail[tc.fail] = errFake
			}
			defer l.Release()
			if p, err := l.NewPlan(4, []string{wt}); err == nil || p != nil {
				t.Fatalf("plan %+v, error %v", p, err)
			}
		})
	}
}

// Remove and Release detach the layers' tmpfs mounts before the
// directories go (a layer's files are not left mounted in shim).
func TestTheLayersTmpfsMountsAreDetachedWhenTheyGo(t *testing.T) {
	k := useFakeKernel(t)
	dir, wt := t.TempDir(), t.TempDir()
	l := New(Config{Dir: dir, WorktreeSize: 1 << 20})
	for _, n := range []uint64{5, 6} {
		if _, err := l.NewPlan(n, []string{wt}); err != nil {
			t.Fatal(err)
		}
	}
	wd := filepath.Dir(l.WorktreeUpper(wt, 5))
	if err := l.Remove(5); err != nil {
		t.Fatal(err)
	}
	k.inOrder(t, "unmount "+filepath.Join(dir, "root", "5"), "unmount "+wd)
	if _, err := os.Stat(wd); err == nil {
		t.Error("the worktree layer is left")
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	k.inOrder(t, "unmount "+filepath.Join(dir, "root", "6"))
	if k.mounted[filepath.Join(dir, "root", "6")] {
		t.Error("a root layer is left mounted after Release")
	}
	if used, limit, _, ok := l.Usage(l.WorktreeUpper(wt, 6)); !ok || limit <= 0 || used < 0 {
		t.Errorf("a bounded layer's usage: %d %d %v", used, limit, ok)
	}
	if !strings.HasPrefix(k.all()[0], "tmpfs ") {
		t.Errorf("calls %q", k.all())
	}
}
