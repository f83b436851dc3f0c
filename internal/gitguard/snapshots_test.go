package gitguard

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// List gives each snapshot the counts Show gives it (it gave 0s: the
// counts came only from Show's diff), for snapshots with changes of every
// kind and one without any.
func TestListCountsAsShowDoes(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	g := f.guard(t, nil)
	edits := []func(){
		func() { writeFile(t, filepath.Join(f.wt, "README.md"), "gen 1\n") },
		func() {
			writeFile(t, filepath.Join(f.wt, "new.txt"), "new\n")
			writeFile(t, filepath.Join(f.wt, "src/more.go"), "package main\n")
			must(t, os.Remove(filepath.Join(f.wt, "script.sh")))
			writeFile(t, filepath.Join(f.wt, "README.md"), "gen 2\n")
		},
		func() {}, // nothing changed
	}
	for i, edit := range edits {
		edit()
		if _, err := g.Restore(ctx, uint64(i+1), f.baseline); err != nil {
			t.Fatal(err)
		}
	}
	list, err := g.List(ctx)
	if err != nil || len(list) != len(edits) {
		t.Fatalf("list: %+v %v", list, err)
	}
	want := map[uint64][3]int{1: {1, 0, 0}, 2: {1, 2, 1}, 3: {0, 0, 0}}
	for _, s := range list {
		shown, err := g.Show(ctx, s.Generation)
		if err != nil {
			t.Fatal(err)
		}
		got := [3]int{s.Modified, s.Added, s.Deleted}
		if got != [3]int{shown.Modified, shown.Added, shown.Deleted} || got != want[s.Generation] || s.Paths != nil {
			t.Errorf("generation %d: listed %v, shown %d %d %d, want %v", s.Generation, got, shown.Modified, shown.Added, shown.Deleted, want[s.Generation])
		}
	}
}

// rawCounter reads diff-tree's -z output however it is split into writes.
func TestRawCounterTakesAnySplit(t *testing.T) {
	c1, c2 := strings.Repeat("a", 40), strings.Repeat("b", 40)
	z := strings.Repeat("0", 40)
	out := c1 + "\x00" +
		":100644 100644 " + z + " " + z + " M\x00" + strings.Repeat("long/", 100) + "x\x00" +
		":000000 100644 " + z + " " + z + " A\x00:odd name\x00" +
		c2 + "\x00" +
		":100644 000000 " + z + " " + z + " D\x00gone\x00" +
		":100644 120000 " + z + " " + z + " T\x00link\x00"
	for _, size := range []int{1, 7, len(out)} {
		c := &rawCounter{counts: map[string]*[3]int{}}
		for i := 0; i < len(out); i += size {
			c.Write([]byte(out[i:min(i+size, len(out))]))
		}
		if a, b := c.counts[c1], c.counts[c2]; a == nil || b == nil || *a != [3]int{1, 1, 0} || *b != [3]int{1, 0, 1} || len(c.counts) != 2 {
			t.Errorf("writes of %d: %v", size, c.counts)
		}
	}
}
