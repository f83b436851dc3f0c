package gitguard

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Findings of the adversarial review of readHistory (the history of the
// harness's heads read from the layer's objects instead of rev-list):
// each planted head is one rev-list --objects refuses; before the fixes
// readHistory called it whole, so it became a parent of the snapshot
// (the repository's repack and fsck then failed) or failed the snapshot.
// Each test's control shows rev-list refuses the head.

// plantHead plants a loose commit on tree with parent base as the
// layer's branch, and returns it.
func plantHead(t *testing.T, f *fixture, up, tree string) string {
	t.Helper()
	id, _ := plantBranch(t, up, tree, f.baseline, "odd")
	return id
}

// plantBranch plants a loose commit of msg on tree with parent as the
// layer's branch main, and returns it and its body.
func plantBranch(t *testing.T, up, tree, parent, msg string) (id, body string) {
	t.Helper()
	body = fmt.Sprintf("tree %s\nparent %s\nauthor h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\n%s\n", tree, parent, msg)
	id = writeLoose(t, up, "commit", body)
	must(t, os.MkdirAll(filepath.Join(up, ".git", "refs", "heads"), 0o755))
	writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), id+"\n")
	return id, body
}

// wantBrokenHeadLeftOut snapshots the layer up and checks the planted
// head, which rev-list refuses once its objects are in the repository
// (the control, run after the import: before it, any head is unknown to
// git), is not the snapshot's parent, and that the repository's history
// still walks, passes fsck, and repacks in full, with maintenance too.
func wantBrokenHeadLeftOut(t *testing.T, f *fixture, g *Guard, up, head string) {
	t.Helper()
	rep := snapshotLayerOK(t, f, g, 1, up)
	if out, err := tgitErr(f.wt, "rev-list", "--objects", head, "--not", f.baseline); err == nil {
		t.Fatal("control: rev-list walks the planted head; nothing broken was planted")
	} else {
		t.Logf("control: rev-list refuses the head: %s", lastLines(out))
	}
	if rep.HeadBefore == head {
		t.Errorf("the head rev-list refuses (%s) is the snapshot's parent (local_commits %d)", head, rep.LocalCommits)
	}
	if out, err := tgitErr(f.wt, "rev-list", "--all", "--objects"); err != nil {
		t.Errorf("the repository's history cannot be walked after the snapshot: %v\n%s", err, lastLines(out))
	}
	// And the next maintenance that prunes a snapshot (a full repack).
	if _, err := g.Maintain(context.Background(), MaintainOptions{}); err != nil {
		t.Errorf("maintain after the snapshot: %v", err)
	}
	wantRepositoryWhole(t, f)
}

// wantRepositoryWhole checks the fixture's repository passes fsck of its
// connectivity and repacks in full.
func wantRepositoryWhole(t *testing.T, f *fixture) {
	t.Helper()
	if out, err := tgitErr(f.wt, "fsck", "--connectivity-only", "--no-dangling"); err != nil {
		t.Errorf("fsck after the snapshot: %v\n%s", err, lastLines(out))
	}
	if out, err := tgitErr(f.wt, "repack", "-a", "-d", "-q"); err != nil {
		t.Errorf("a full repack after the snapshot: %v\n%s", err, lastLines(out))
	}
}

func lastLines(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > 4 {
		l = l[len(l)-4:]
	}
	return strings.Join(l, "\n")
}

// A commit whose tree line names a blob the repository has: readHistory
// skips the type check for objects the store has (any non-commit).
func TestCommitWhoseTreeIsARepositoryBlob(t *testing.T) {
	f, g, up := hostileLayer(t)
	readme := tgit(t, f.wt, "rev-parse", f.baseline+":README.md")
	head := plantHead(t, f, up, readme)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// A commit whose tree line names the baseline commit itself.
func TestCommitWhoseTreeIsTheBaselineCommit(t *testing.T) {
	f, g, up := hostileLayer(t)
	head := plantHead(t, f, up, f.baseline)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// A tree entry of mode "040000" (git reads it as a directory, octal)
// naming a fresh blob: readHistory takes any mode but "40000" and
// "160000" for a blob.
func TestTreeEntryMode040000NamingABlob(t *testing.T) {
	f, g, up := hostileLayer(t)
	blob := writeLoose(t, up, "blob", "a blob\n")
	tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("040000 d "+blob))))
	head := plantHead(t, f, up, tree)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// A tree entry whose mode is not octal: git's tree parser refuses the
// tree ("malformed mode in tree entry"); readHistory takes it for a blob.
func TestTreeEntryWithAMalformedMode(t *testing.T) {
	f, g, up := hostileLayer(t)
	blob := writeLoose(t, up, "blob", "a blob\n")
	tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100648 f "+blob))))
	head := plantHead(t, f, up, tree)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// One fresh tree named twice in a tree, as a blob ("100644 a") and as a
// directory ("40000 b"): readHistory walks "b" first (a stack), marks
// the tree seen, and skips "a"; git walks "a" first and refuses "b".
func TestOneObjectNamedAsTwoTypes(t *testing.T) {
	f, g, up := hostileLayer(t)
	blob := writeLoose(t, up, "blob", "inner\n")
	inner := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100644 x "+blob))))
	outer := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100644 a "+inner, "40000 b "+inner))))
	head := plantHead(t, f, up, outer)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// A commit of only its tree line ("tree X\n", 46 bytes): git refuses it
// ("bogus commit object": its parser wants a byte after the line), while
// commitLinks reads it as a root commit.
func TestCommitOfOnlyItsTreeLine(t *testing.T) {
	f, g, up := hostileLayer(t)
	baseTree := tgit(t, f.wt, "rev-parse", f.baseline+"^{tree}")
	head := writeLoose(t, up, "commit", "tree "+baseTree+"\n")
	must(t, os.MkdirAll(filepath.Join(up, ".git", "refs", "heads"), 0o755))
	writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), head+"\n")
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// A commit that ends right after its parent line ("tree X\nparent Y\n"):
// git refuses it ("bad parents in commit": its parser wants a byte after
// the line); commitLinks reads the parent.
func TestCommitEndingRightAfterItsParentLine(t *testing.T) {
	f, g, up := hostileLayer(t)
	baseTree := tgit(t, f.wt, "rev-parse", f.baseline+"^{tree}")
	head := writeLoose(t, up, "commit", fmt.Sprintf("tree %s\nparent %s\n", baseTree, f.baseline))
	must(t, os.MkdirAll(filepath.Join(up, ".git", "refs", "heads"), 0o755))
	writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), head+"\n")
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// The fence's first snapshot attempt fails (fast-import loads the head's
// tree: a blob) where git's check would have left the head out; a retry
// succeeds only because the first left the objects packed (no longer fresh).
func TestFirstSnapshotAttemptFails(t *testing.T) {
	f, g, up := hostileLayer(t)
	readme := tgit(t, f.wt, "rev-parse", f.baseline+":README.md")
	plantHead(t, f, up, readme)
	if _, err := g.SnapshotLayer(context.Background(), 1, f.baseline, up); err != nil {
		t.Errorf("first attempt: %v", err)
	}
}

// The maintenance that prunes an older snapshot fails (its full repack
// walks the broken head kept as a parent of a newer one).
func TestMaintainFailsAfterABrokenParent(t *testing.T) {
	f := newFixture(t)
	g := f.guard(t, nil)
	for gen := uint64(1); gen <= 3; gen++ {
		up := filepath.Join(f.root, fmt.Sprintf("layer-%d", gen), "upper")
		writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
		if gen == 3 {
			blob := writeLoose(t, up, "blob", "a blob\n")
			tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("040000 d "+blob))))
			plantHead(t, f, up, tree)
		}
		snapshotLayerOK(t, f, g, gen, up)
	}
	rep, err := g.Maintain(context.Background(), MaintainOptions{KeepSnapshots: 1, Slack: 1})
	if err != nil {
		t.Errorf("maintain: %v (%s)", err, rep.Error)
	}
}
