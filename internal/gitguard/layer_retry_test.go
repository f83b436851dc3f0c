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
func TestALayerRetryAfterAnImportWithABrokenHead(t *testing.T) {
	f, g, up := hostileLayer(t)
	tree := tgit(t, f.wt, "rev-parse", f.baseline+"^{tree}")
	id, body := plantBranch(t, up, tree, strings.Repeat("1", 40), "broken")
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

// Review: a loose object whose header is not git's (a size "+N", "0N",
// two spaces) hashes to its name, so gitformat.VerifyLoose takes it; but the pack
// gives it git's header, and index-pack names it otherwise. A ref naming
// such a commit is taken for a verified loose commit (no cat-file), made
// a parent, and fast-import fails on it: the whole fence failed.
func TestALooseCommitWithANonCanonicalHeaderDoesNotFailTheFence(t *testing.T) {
	for _, hdr := range []string{"commit +%d\x00", "commit 0%d\x00", "commit  %d\x00", "commit\t%d\x00"} {
		t.Run(strings.TrimSpace(fmt.Sprintf(strings.TrimSuffix(hdr, "\x00"), 0)), func(t *testing.T) {
			f, g, up := hostileLayer(t)
			tree := tgit(t, f.wt, "rev-parse", f.baseline+"^{tree}")
			body := fmt.Sprintf("tree %s\nparent %s\nauthor h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\nodd header\n", tree, f.baseline)
			id := writeLooseRaw(t, up, fmt.Sprintf(hdr, len(body))+body)
			must(t, os.MkdirAll(filepath.Join(up, ".git", "refs", "heads"), 0o755))
			writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), id+"\n")
			snapshotLayerOK(t, f, g, 1, up)
			if _, err := tgitErr(f.wt, "rev-list", "--all", "--objects"); err != nil {
				t.Errorf("the repository's history cannot be walked after the snapshot: %v", err)
			}
		})
	}
}

// Review: loose objects that hash to their names but that git would not
// write (a tree, a commit, a tag of garbage; sizes at the stored block's
// bounds; many) must not fail the pack of them, nor the fence.
func TestOddLooseObjectsDoNotFailTheFence(t *testing.T) {
	f, g, up := hostileLayer(t)
	var ids []string
	for _, typ := range []string{"tree", "commit", "tag"} {
		ids = append(ids, writeLooseRaw(t, up, fmt.Sprintf("%s 7\x00garbage", typ)))
		ids = append(ids, writeLooseRaw(t, up, fmt.Sprintf("%s 0\x00", typ)))
	}
	for _, n := range []int{0, 1, 65534, 65535, 65536, 65537, 2*65535 + 1} {
		body := strings.Repeat("x", n)
		ids = append(ids, writeLooseRaw(t, up, fmt.Sprintf("blob %d\x00%s", n, body)))
	}
	for i := 0; i < 3000; i++ {
		writeLooseRaw(t, up, fmt.Sprintf("blob %d\x00%d", len(fmt.Sprint(i)), i))
	}
	// a ref naming the garbage commit and a tag of garbage
	must(t, os.MkdirAll(filepath.Join(up, ".git", "refs", "heads"), 0o755))
	writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), ids[2]+"\n")
	writeFile(t, filepath.Join(up, ".git", "refs", "heads", "tag"), ids[4]+"\n")
	snapshotLayerOK(t, f, g, 1, up)
	for _, id := range ids {
		if _, err := tgitErr(f.wt, "cat-file", "-e", id); err != nil {
			t.Logf("%s not imported", id)
		}
	}
}
