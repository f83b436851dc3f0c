package gitguard

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/testutil"
)

// Findings of the second adversarial review of the heads' history (after
// the first review's fixes): blob entries naming a tree or a commit of the
// repository's, which rev-list --objects HEAD --not BASE passes where it
// has not typed the name itself, but fsck and a full repack refuse; the
// types typeOf reads from real packs; sealing through a planted link.

// A tree entry of blob mode naming an object the repository has as a
// tree (the baseline's own subtree "src"): readHistory only asks that a
// blob exist; rev-list has typed "src" as a tree (the baseline's tree,
// marked uninteresting) and dies ("has blob mode, but is not a blob").
func TestBlobEntryNamingABaselineSubtree(t *testing.T) {
	f, g, up := hostileLayer(t)
	src := tgit(t, f.wt, "rev-parse", f.baseline+":src")
	tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100644 f "+src))))
	head := plantHead(t, f, up, tree)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// The same with the baseline commit named as a blob.
func TestBlobEntryNamingTheBaselineCommit(t *testing.T) {
	f, g, up := hostileLayer(t)
	tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100644 f "+f.baseline))))
	head := plantHead(t, f, up, tree)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// A root commit of the harness's (no parent) whose tree names the
// baseline commit as a blob: readHistory has not seen the baseline (no
// parent line names it) and only asks that the blob exist.
func TestRootCommitWithABlobEntryNamingTheBaseline(t *testing.T) {
	f, g, up := hostileLayer(t)
	tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100644 f "+f.baseline))))
	head := writeLoose(t, up, "commit", "tree "+tree+"\nauthor h <h@h> 1 +0000\ncommitter h <h@h> 1 +0000\n\nroot\n")
	writeFile(t, up+"/.git/refs/heads/main", head+"\n")
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// A blob-mode entry naming a tree the repository has that the
// baseline's history does not reach (here on a side branch; in life any
// older commit's directory, or a previous snapshot's): rev-list HEAD --not
// BASE never types that tree, so git's own check (complete, the old path)
// walks the head too; but the repository's fsck and full repack walk it as
// a tree too, and die. Neither check may make such a head a parent.
func TestBlobEntryNamingATreeOffTheBaselinesHistory(t *testing.T) {
	f, g, up := hostileLayer(t)
	side := sideTree(t, f)
	tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100644 f "+side))))
	head := plantHead(t, f, up, tree)
	rep := snapshotLayerOK(t, f, g, 1, up)
	// control (the head's objects are in the repository now, parent or not)
	if out, err := tgitErr(f.wt, "rev-list", "--objects", head, "--not", f.baseline); err != nil {
		t.Logf("rev-list refuses the head: %s", lastLines(out))
	} else {
		t.Logf("control: rev-list --objects HEAD --not BASE walks the head (git's check, complete, would keep it too)")
	}
	if rep.HeadBefore == head {
		t.Errorf("the head is the snapshot's parent (local_commits %d)", rep.LocalCommits)
	}
	wantRepositoryWhole(t, f)
}

// The same through git's check alone (complete): a pack of the
// harness's in the layer (any) means the layer's objects do not tell the
// history, and rev-list --objects HEAD --not BASE decides.
func TestBlobEntryNamingATreeOffTheBaselinesHistoryGitsCheck(t *testing.T) {
	f, g, up := hostileLayer(t)
	side := sideTree(t, f)
	// a pack of one unrelated blob of the harness's
	scratch := t.TempDir()
	tgit(t, scratch, "init", "-q")
	writeFile(t, scratch+"/b", "a packed blob of the harness's\n")
	blob := tgit(t, scratch, "hash-object", "-w", "b")
	cmd := exec.Command("/usr/bin/git", "pack-objects", "-q", up+"/.git/objects/pack/pack")
	cmd.Dir, cmd.Stdin, cmd.Env = scratch, strings.NewReader(blob+"\n"), testEnv(scratch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pack-objects: %v %s", err, out)
	}
	tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100644 f "+side))))
	head := plantHead(t, f, up, tree)
	rep := snapshotLayerOK(t, f, g, 1, up)
	if _, err := tgitErr(f.wt, "rev-list", "--objects", head, "--not", f.baseline); err != nil {
		t.Fatalf("control: rev-list refuses the head")
	}
	if rep.HeadBefore == head {
		t.Errorf("the head is the snapshot's parent (local_commits %d)", rep.LocalCommits)
	}
	wantRepositoryWhole(t, f)
}

// typeOf on packs as git writes them with the longest chains it allows
// (--depth=4095), with named bases (REF_DELTA), beside a multi-pack-index
// and a cruft pack: every object's type is cat-file's.
func TestTypeOfDeepChainsRefDeltasAndMidx(t *testing.T) {
	for _, c := range []struct{ name, offsets, format string }{{"ofs", "true", "sha1"}, {"ref", "false", "sha1"}, {"ref256", "false", "sha256"}} {
		t.Run(c.name, func(t *testing.T) {
			repo := filepath.Join(t.TempDir(), "repo")
			tgit(t, filepath.Dir(repo), "init", "-q", "--object-format="+c.format, repo)
			var fi strings.Builder
			// 1,500 commits of one file, each version the one before with
			// a line inserted somewhere: the best base of each is the next
			// (one deletion away; git deltas from the larger)
			rnd := rand.New(rand.NewPCG(1, 2))
			var lines []string
			for i := 0; i < 1500; i++ {
				at := rnd.IntN(len(lines) + 1)
				lines = append(lines[:at], append([]string{fmt.Sprintf("%016x %d\n", rnd.Uint64(), i)}, lines[at:]...)...)
				body := strings.Join(lines, "")
				fmt.Fprintf(&fi, "commit refs/heads/main\ncommitter c <c@c> %d +0000\ndata 2\nc\nM 100644 inline f\ndata %d\n%s\n", i+1, len(body), body)
			}
			cmd := exec.Command("/usr/bin/git", "fast-import", "--quiet")
			cmd.Dir, cmd.Stdin, cmd.Env = repo, strings.NewReader(fi.String()), testEnv(repo)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("fast-import: %v %s", err, out)
			}
			tgit(t, repo, "-c", "repack.useDeltaBaseOffset="+c.offsets, "-c", "pack.threads=1", "repack", "-adfq", "--depth=4095", "--window=250")
			// a second pack and a multi-pack-index over both
			tgit(t, repo, "checkout", "-q", "main")
			writeFile(t, filepath.Join(repo, "x.txt"), strings.Join(lines, "")+"more\n")
			tgit(t, repo, "add", "x.txt")
			tgit(t, repo, "-c", "user.name=u", "-c", "user.email=u@u", "commit", "-qm", "x")
			tgit(t, repo, "-c", "repack.useDeltaBaseOffset="+c.offsets, "repack", "-dq")
			tgit(t, repo, "multi-pack-index", "write")
			maxDepth := 0
			for _, idx := range mustGlobs(t, filepath.Join(repo, ".git", "objects", "pack", "*.idx")) {
				for _, line := range strings.Split(tgit(t, repo, "verify-pack", "-v", idx), "\n") {
					if f := strings.Fields(line); len(f) >= 7 {
						if d, _ := strconv.Atoi(f[5]); d > maxDepth {
							maxDepth = d
						}
					}
				}
			}
			t.Logf("deepest chain %d", maxDepth)
			if maxDepth < 300 {
				t.Fatalf("control: the deepest chain is %d", maxDepth)
			}
			hexLen := map[string]int{"sha1": 40, "sha256": 64}[c.format]
			store, ok := openObjectStore(filepath.Join(repo, ".git"), hexLen)
			if !ok {
				t.Fatal("the store cannot be read")
			}
			defer store.close()
			if n := typesAreGits(t, repo, store); n < 4500 {
				t.Errorf("%d objects", n)
			}
		})
	}
}

func mustGlobs(t *testing.T, pat string) []string {
	t.Helper()
	m, _ := filepath.Glob(pat)
	if len(m) == 0 {
		t.Fatalf("%s: none", pat)
	}
	return m
}

// sealPacks changes the inode a pack-* name links to, whatever it is:
// a hard link (lstat says a regular file) to a file outside the
// repository is made root's and read-only. Whoever could write the git
// dir before its first layered generation (the owner's uid: a scan-mode
// harness, any process of the owner's) plants one; sealing runs as root.
// (And the chmod follows a symlink swapped in after the lstat.)
func TestSealPacksChangesAHardLinkedFileOutsideTheRepository(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.Need(t, false, "sealing packs needs root")
	}
	f := newFixture(t)
	tgit(t, f.wt, "repack", "-adq")
	victim := filepath.Join(f.outside, "victim")
	writeFile(t, victim, "someone else's file\n")
	must(t, os.Chown(victim, 4242, 4242))
	must(t, os.Chmod(victim, 0o664))
	must(t, os.Link(victim, filepath.Join(f.wt, ".git", "objects", "pack", "pack-planted.keep")))
	must(t, sealPacks(filepath.Join(f.wt, ".git")))
	st, err := os.Stat(victim)
	must(t, err)
	if uid := statUID(st); uid != 4242 || st.Mode().Perm() != 0o664 {
		t.Errorf("a file outside the repository was changed by the seal: uid %d mode %v", uid, st.Mode().Perm())
	}
}

// sideTree commits a directory on a side branch of the fixture (its
// worktree back on main after) and returns that directory's tree: a tree
// the repository has that the baseline's history does not reach.
func sideTree(t *testing.T, f *fixture) string {
	t.Helper()
	tgit(t, f.wt, "checkout", "-q", "-b", "side")
	writeFile(t, f.wt+"/side/x.txt", "side\n")
	tgit(t, f.wt, "add", "-A")
	tgit(t, f.wt, "commit", "-q", "-m", "side")
	side := tgit(t, f.wt, "rev-parse", "HEAD:side")
	tgit(t, f.wt, "checkout", "-q", "main")
	return side
}
