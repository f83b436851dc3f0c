package gitguard

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/gitformat"
)

// A worktree layer is a plain directory once its generation is dead: these
// tests build hostile uppers by hand (what a harness can leave in one) and
// check that SnapshotLayer saves the edits and never fails, hangs or
// poisons the repository because of what the harness planted. Findings of
// the adversarial review of the layers.

func hostileLayer(t *testing.T) (*fixture, *Guard, string) {
	t.Helper()
	f := newFixture(t)
	g := f.guard(t, nil)
	dir := filepath.Join(f.root, "layer")
	up := filepath.Join(dir, "upper")
	must(t, os.MkdirAll(filepath.Join(up, ".git", "objects", "pack"), 0o755))
	writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
	return f, g, up
}

func snapshotLayerOK(t *testing.T, f *fixture, g *Guard, gen uint64, up string) *Report {
	t.Helper()
	rep, err := g.SnapshotLayer(context.Background(), gen, f.baseline, up)
	if err != nil {
		t.Fatalf("SnapshotLayer: %v", err)
	}
	if got := tgit(t, f.wt, "show", rep.SnapshotCommit+":README.md"); got != "edited by the harness" {
		t.Fatalf("the edit is not in the snapshot: %q", got)
	}
	return rep
}

// A pack git refuses is left out and listed; the fence goes on (it was
// RESTORE_FAILED on every retry).
func TestALayersRejectedPackIsListedNotFatal(t *testing.T) {
	f, g, up := hostileLayer(t)
	writeFile(t, filepath.Join(up, ".git", "objects", "pack", "pack-bad.pack"), strings.Repeat("garbage", 200))
	rep := snapshotLayerOK(t, f, g, 1, up)
	if len(rep.NotStored) != 1 || rep.NotStored[0].Type != "pack_rejected" {
		t.Errorf("not_stored: %+v", rep.NotStored)
	}
}

// A zlib bomb (a small loose object that inflates to far more than a
// loose object may be) is never inflated in full: its header is read and
// it is refused.
func TestALayersZlibBombIsRefusedFromItsHeader(t *testing.T) {
	f, g, up := hostileLayer(t)
	var z bytes.Buffer
	zw, _ := zlib.NewWriterLevel(&z, zlib.BestCompression)
	fmt.Fprintf(zw, "blob %d\x00", 1<<30)
	zeros := make([]byte, 1<<20)
	for i := 0; i < 64; i++ { // 64 MiB of zeros in about 64 KiB
		zw.Write(zeros)
	}
	zw.Close()
	name := strings.Repeat("ab", 20)
	writeFile(t, filepath.Join(up, ".git", "objects", name[:2], name[2:]), z.String())
	snapshotLayerOK(t, f, g, 1, up)
	if _, err := tgitErr(f.wt, "cat-file", "-e", name); err == nil {
		t.Errorf("the bomb was imported")
	}
	if c := gitformat.VerifyLoose(bytes.NewReader(z.Bytes()), name, maxLooseObject, nil, 0); c.OK || c.Inflated > 64 {
		t.Errorf("VerifyLoose inflated %d bytes of a header that claims 1 GiB (ok %v)", c.Inflated, c.OK)
	}
}

// A harness commit whose parent is missing is not made a parent of the
// snapshot: its history would break git log, gc and clone of the real
// repository.
func TestALayersHeadWithAMissingParentIsNotAParent(t *testing.T) {
	f, g, up := hostileLayer(t)
	tree := tgit(t, f.wt, "rev-parse", f.baseline+"^{tree}")
	id, _ := plantBranch(t, up, tree, strings.Repeat("1", 40), "broken")
	rep := snapshotLayerOK(t, f, g, 1, up)
	// control: the commit was imported, and its history is broken
	if _, err := tgitErr(f.wt, "rev-list", "--objects", id, "--not", f.baseline); err == nil {
		t.Fatal("control: the planted commit's history walks; the test plants nothing broken")
	}
	if rep.HeadBefore != f.baseline || rep.LocalCommits != 0 {
		t.Errorf("head_before %s local_commits %d: the broken head was used", rep.HeadBefore, rep.LocalCommits)
	}
	if _, err := tgitErr(f.wt, "rev-list", "--all", "--objects"); err != nil {
		t.Errorf("the repository's history cannot be walked after the snapshot: %v", err)
	}
}

// A snapshot ref of the same number that this layer did not make (a
// previous shim's generation, its state lost) is not taken for this
// layer's snapshot: the layer is imported with it as a parent.
func TestALayerIsSavedEvenWhenItsSnapshotRefExistsFromAnotherShim(t *testing.T) {
	f, g, up := hostileLayer(t)
	tgit(t, f.wt, "update-ref", RefPrefix+"1", f.baseline)
	rep := snapshotLayerOK(t, f, g, 1, up)
	if rep.SnapshotReused {
		t.Fatal("an older generation 1's snapshot was reused for this layer")
	}
	if got := tgit(t, f.wt, "rev-list", "--count", rep.SnapshotCommit); got == "1" {
		t.Errorf("the older snapshot is not kept reachable")
	}
	// A retry of this fence reuses what it made.
	again, err := g.SnapshotLayer(context.Background(), 1, f.baseline, up)
	if err != nil || !again.SnapshotReused || again.SnapshotCommit != rep.SnapshotCommit {
		t.Errorf("a retry: %v %+v", err, again)
	}
}

// writeLoose writes a loose object into the layer's .git and returns its id.
func writeLoose(t *testing.T, up, typ, body string) string {
	t.Helper()
	return writeLooseRaw(t, up, fmt.Sprintf("%s %d\x00%s", typ, len(body), body))
}

// writeLooseRaw writes raw (header included) as a loose object named by
// its hash, whatever the header says.
func writeLooseRaw(t *testing.T, up, raw string) string {
	t.Helper()
	sum := sha1.Sum([]byte(raw))
	id := hex.EncodeToString(sum[:])
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	zw.Write([]byte(raw))
	zw.Close()
	writeFile(t, filepath.Join(up, ".git", "objects", id[:2], id[2:]), z.String())
	return id
}

// The layer's snapshot ref is shim's: a scan restore after it (a moved
// baseline, a push check) keeps it where it is instead of moving it aside
// as a ref the harness made.
func TestALayersSnapshotRefSurvivesAScanRestoreAfterIt(t *testing.T) {
	f, g, up := hostileLayer(t)
	if _, err := g.Restore(context.Background(), 1, f.baseline); err != nil { // the trusted ref namespace
		t.Fatal(err)
	}
	rep := snapshotLayerOK(t, f, g, 2, up)
	scan, err := g.Restore(context.Background(), 2, f.baseline)
	if err != nil {
		t.Fatal(err)
	}
	if got := tgit(t, f.wt, "rev-parse", RefPrefix+"2"); got != rep.SnapshotCommit || len(scan.RefsMoved) != 0 {
		t.Errorf("after the scan: %s = %s (want %s), refs moved %+v", RefPrefix+"2", got, rep.SnapshotCommit, scan.RefsMoved)
	}
}

// A moved baseline after a layer's snapshot (or a fetch's continue after a
// restore): the clean worktree is moved, and the snapshot ref keeps the
// generation's edits (a plain Restore took the old baseline for edits and
// recorded it as a new snapshot over the layer's).
func TestAMoveAfterALayersSnapshotKeepsTheSnapshot(t *testing.T) {
	f, g, up := hostileLayer(t)
	writeFile(t, filepath.Join(f.wt, "next.txt"), "the next baseline\n")
	tgit(t, f.wt, "add", "next.txt")
	tgit(t, f.wt, "commit", "-qm", "next")
	next := tgit(t, f.wt, "rev-parse", "HEAD")
	tgit(t, f.wt, "reset", "-q", "--hard", f.baseline)
	rep := snapshotLayerOK(t, f, g, 1, up)
	moved, err := g.Restore(context.Background(), 1, next, WithSavedSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	if got := tgit(t, f.wt, "rev-parse", RefPrefix+"1"); got != rep.SnapshotCommit || !moved.SnapshotReused || moved.Baseline != next {
		t.Errorf("snapshot ref %s (want %s), reused %v, baseline %s (want %s)", got, rep.SnapshotCommit, moved.SnapshotReused, moved.Baseline, next)
	}
	if got := tgit(t, f.wt, "rev-parse", "HEAD"); got != next {
		t.Errorf("the worktree is at %s, want %s", got, next)
	}
}

// The harness's loose objects come in as one pack, each checked against
// its name first: one whose bytes are not what its name says (a forged
// name, which would make the repository answer that name with the
// harness's bytes) and one that is not zlib are left out; the rest are
// objects of the repository, big ones too.
func TestALayersLooseObjectsArePackedOnlyWhenTheirNameIsTheirHash(t *testing.T) {
	f, g, up := hostileLayer(t)
	good := writeLoose(t, up, "blob", "a blob of the harness\n")
	big := writeLoose(t, up, "blob", strings.Repeat("0123456789abcdef", 1<<16)) // 1 MiB: a multi-byte size header
	empty := writeLoose(t, up, "blob", "")
	// A forged name: the bytes of one blob under the name of another.
	forged := writeLoose(t, up, "blob", "the real bytes\n")
	must(t, os.Remove(filepath.Join(up, ".git", "objects", forged[:2], forged[2:])))
	var z bytes.Buffer
	zw := zlib.NewWriter(&z)
	fmt.Fprintf(zw, "blob 11\x00other bytes")
	zw.Close()
	writeFile(t, filepath.Join(up, ".git", "objects", forged[:2], forged[2:]), z.String())
	notZlib := strings.Repeat("cd", 20)
	writeFile(t, filepath.Join(up, ".git", "objects", notZlib[:2], notZlib[2:]), "not zlib at all")
	packs := func() int {
		ps, _ := filepath.Glob(filepath.Join(f.wt, ".git", "objects", "pack", "*.pack"))
		return len(ps)
	}
	before := packs()
	snapshotLayerOK(t, f, g, 1, up)
	for _, id := range []string{good, big, empty} {
		if _, err := tgitErr(f.wt, "cat-file", "-e", id); err != nil {
			t.Errorf("object %s was not imported", id)
		}
	}
	if got := tgit(t, f.wt, "cat-file", "-p", good); got != "a blob of the harness" {
		t.Errorf("object %s reads %q", good, got)
	}
	if got := tgit(t, f.wt, "cat-file", "-s", big); got != "1048576" {
		t.Errorf("object %s has %s bytes", big, got)
	}
	for _, id := range []string{forged, notZlib} {
		if _, err := tgitErr(f.wt, "cat-file", "-e", id); err == nil {
			t.Errorf("object %s was imported", id)
		}
	}
	if n := packs() - before; n != 2 { // the harness's objects, the snapshot's
		t.Errorf("%d packs added, want 2", n)
	}
	tgit(t, f.wt, "fsck", "--no-dangling")
}

// refusingRunner runs git, but fails every index-pack as git does on a
// pack it refuses.
type refusingRunner struct{}

func (refusingRunner) Run(ctx context.Context, cmd *exec.Cmd) error {
	for _, a := range cmd.Args {
		if a == "index-pack" {
			return errors.New("index-pack: refused")
		}
	}
	return ExecRunner{}.Run(ctx, cmd)
}

// A pack of the harness's loose objects that cannot be added is listed
// and left out, as a pack of the harness's own is: the layer is still
// saved, without the head those objects held. Two ways: git refuses it
// (none known that passes their check: index-pack made to refuse, on a
// repository with alternates, whose pack index-pack writes), and shim
// cannot write it (its temporary name taken). Control: with the pack
// added, the head is the snapshot's first parent.
func TestALayersLooseObjectsGitRefusesAreListedNotFatal(t *testing.T) {
	for _, how := range []string{"control: added", "refused by git", "not written"} {
		t.Run(how, func(t *testing.T) {
			f := newFixture(t)
			g := f.guard(t, func(cfg *Config) {
				if how == "refused by git" {
					cfg.Runner = refusingRunner{}
				}
			})
			objects := filepath.Join(tgit(t, f.wt, "rev-parse", "--absolute-git-dir"), "objects")
			switch how {
			case "refused by git":
				other := filepath.Join(t.TempDir(), "objects")
				must(t, os.MkdirAll(other, 0o755))
				writeFile(t, filepath.Join(objects, "info", "alternates"), other+"\n")
			case "not written":
				must(t, os.MkdirAll(filepath.Join(objects, "pack", "tmp_pack_shim_"+strconv.Itoa(os.Getpid())+".pack"), 0o755))
			}
			up := filepath.Join(f.root, "layer", "upper")
			writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
			tree := tgit(t, f.wt, "rev-parse", f.baseline+"^{tree}")
			id := writeLoose(t, up, "commit", fmt.Sprintf("tree %s\nparent %s\nauthor h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\nmine\n", tree, f.baseline))
			writeFile(t, filepath.Join(up, ".git", "refs", "heads", "main"), id+"\n")
			rep := snapshotLayerOK(t, f, g, 1, up)
			head := tgit(t, f.wt, "rev-parse", rep.SnapshotCommit+"^1")
			if how != "control: added" {
				if head != f.baseline || len(rep.NotStored) != 1 || rep.NotStored[0].Type != "pack_rejected" {
					t.Errorf("first parent %s (baseline %s), not stored %+v", head, f.baseline, rep.NotStored)
				}
			} else if head != id || len(rep.NotStored) != 0 {
				t.Errorf("first parent %s, want the harness's %s; not stored %+v", head, id, rep.NotStored)
			}
		})
	}
}
