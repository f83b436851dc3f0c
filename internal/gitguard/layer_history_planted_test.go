package gitguard

import (
	"path/filepath"
	"strings"
	"testing"
)

// Findings of the third adversarial review of the heads' history: a
// tree the repository has is not whole because the repository has it: an
// earlier layer's loose objects are imported whether a head names them
// or not, a broken tree too. Only the baseline's trees are taken as whole
// by the walk; git decides for any other.

// plantInRepository has an earlier generation's layer bring the loose
// objects raws (each a whole raw object, header included) into the
// repository through shim's own import, as any layer's loose objects are
// (whether a head names them or not), and returns their names.
func plantInRepository(t *testing.T, f *fixture, g *Guard, gen uint64, raws ...[]byte) []string {
	t.Helper()
	up := filepath.Join(f.root, "earlier-layer", "upper")
	writeFile(t, filepath.Join(up, "README.md"), "edited by the harness\n")
	var ids []string
	for _, raw := range raws {
		ids = append(ids, writeLooseRaw(t, up, string(raw)))
	}
	snapshotLayerOK(t, f, g, gen, up)
	for _, id := range ids {
		if _, err := tgitErr(f.wt, "cat-file", "-e", id); err != nil {
			t.Fatalf("control: the earlier layer's object %s is not in the repository", id)
		}
	}
	return ids
}

// An earlier generation's layer leaves a broken tree (an entry naming a
// blob no one has) in the repository: shim imports every loose object of
// a layer, a dangling one too. The next generation's head names that
// tree: readHistory takes any tree the repository has for whole ("the
// repository's own history is whole"), so the head is a parent.
// (The earlier layer is generation 2 and the head's generation 1 only
// because wantBrokenHeadLeftOut snapshots generation 1: their order is
// nothing to shim.)
func TestPlantedCommitOnABrokenTreeAnEarlierLayerLeft(t *testing.T) {
	f, g, up := hostileLayer(t)
	missing := strings.Repeat("7", 40)
	ids := plantInRepository(t, f, g, 2, rawObject("tree", rawTree("100644 f "+missing)))
	head := plantHead(t, f, up, ids[0])
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// The same one level down: the head's own (fresh, whole) tree has a
// directory entry naming the earlier layer's broken tree.
func TestPlantedSubtreeIsABrokenTreeAnEarlierLayerLeft(t *testing.T) {
	f, g, up := hostileLayer(t)
	missing := strings.Repeat("7", 40)
	ids := plantInRepository(t, f, g, 2, rawObject("tree", rawTree("40000 d "+missing)))
	blob := writeLoose(t, up, "blob", "fine\n")
	tree := writeLooseRaw(t, up, string(rawObject("tree", rawTree("100644 ok "+blob, "40000 sub "+ids[0]))))
	head := plantHead(t, f, up, tree)
	wantBrokenHeadLeftOut(t, f, g, up, head)
}

// An earlier layer's tree whose blob entry names a tree of the
// repository's (a type no check let through as a parent before): walked
// as the next head's tree, the repository's fsck and full repack die.
func TestPlantedEarlierLayersTreeWithABlobEntryNamingATree(t *testing.T) {
	f, g, up := hostileLayer(t)
	src := tgit(t, f.wt, "rev-parse", f.baseline+":src")
	ids := plantInRepository(t, f, g, 2, rawObject("tree", rawTree("100644 f "+src)))
	head := plantHead(t, f, up, ids[0])
	wantBrokenHeadLeftOut(t, f, g, up, head)
}
