package gitguard

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Review: a fence that stopped between its first import (made with every
// head, one of them broken) and the import again without it leaves the
// snapshot ref on a commit whose history is not whole. SnapshotLayer says
// it handles that state (older is kept only whole); its retry must save
// the layer and not fail the fence on every retry.
func TestReviewALayerRetryAfterAnImportWithABrokenHead(t *testing.T) {
	f, g, up := hostileLayer(t)
	tree := tgit(t, f.wt, "rev-parse", f.baseline+"^{tree}")
	body := fmt.Sprintf("tree %s\nparent %s\nauthor h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\nbroken\n", tree, strings.Repeat("1", 40))
	id := writeLoose(t, up, "commit", body)
	must(t, os.MkdirAll(filepath.Join(up, ".git", "refs", "heads"), 0o755))
	writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), id+"\n")
	// The state the first import leaves: the broken head in the repository,
	// the ref on a snapshot that has it as a parent, no marker.
	bodyFile := filepath.Join(f.root, "broken-commit")
	writeFile(t, bodyFile, body)
	if got := tgit(t, f.wt, "hash-object", "-w", "-t", "commit", bodyFile); got != id {
		t.Fatalf("hash-object: %s, want %s", got, id)
	}
	first := tgit(t, f.wt, "commit-tree", "-p", id, "-p", f.baseline, "-m", "first import", tree)
	tgit(t, f.wt, "update-ref", RefPrefix+"1", first)
	rep := snapshotLayerOK(t, f, g, 1, up)
	if _, err := tgitErr(f.wt, "rev-list", "--objects", rep.SnapshotCommit); err != nil {
		t.Errorf("the snapshot's history is not whole: %v", err)
	}
}
