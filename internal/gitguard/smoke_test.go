package gitguard

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
)

func TestSmoke(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	writeFile(t, filepath.Join(f.wt, "README.md"), "changed\n")
	writeFile(t, filepath.Join(f.wt, "newdir/new.txt"), "new\n")
	writeFile(t, filepath.Join(f.wt, "x.log"), "log\n")
	tgit(t, f.wt, "rm", "-q", "docs/guide.txt")
	rep, err := g.Restore(context.Background(), 1, f.baseline)
	b, _ := json.MarshalIndent(rep, "", " ")
	t.Logf("%s", b)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(tgit(t, f.wt, "status", "--porcelain", "--ignored"))
	t.Log(tgit(t, f.wt, "show", "--stat", rep.SnapshotCommit))
	rep, err = g.Restore(context.Background(), 1, f.baseline)
	b, _ = json.MarshalIndent(rep, "", " ")
	t.Logf("%s %v", b, err)
	l, err := g.List(context.Background())
	t.Log(l, err)
	s, err := g.Show(context.Background(), 1)
	t.Log(s, err)
}
