package gitguard

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Review: more layer shapes whose description from the import's answers
// must be diff-tree's.
func TestMoreLayerShapesAreDescribedAsDiffTreeDoes(t *testing.T) {
	requireRoot(t)
	f := newFixture(t)
	must(t, os.Symlink("README.md", filepath.Join(f.wt, "link")))
	must(t, os.Symlink("src", filepath.Join(f.wt, "dirlink")))
	tgit(t, f.wt, "add", "link", "dirlink")
	tgit(t, f.wt, "update-index", "--add", "--cacheinfo", "160000,"+f.baseline+",sub")
	tgit(t, f.wt, "commit", "-q", "-m", "links")
	base := tgit(t, f.wt, "rev-parse", "HEAD")
	g := f.guard(t, nil)
	file, whiteout, _, symlink := upperBuilders(t)
	cases := []struct {
		name  string
		build func(up string)
	}{
		{"whiteouts inside a new directory", func(up string) {
			whiteout(up, "newdir/gone")
			file(up, "newdir/kept", "k\n", 0o644)
		}},
		{"a file with a symlink's target as bytes", func(up string) { file(up, "link", "README.md", 0o644) }},
		{"a symlink whose target is a file's bytes", func(up string) { symlink(up, "README.md", baseFiles["README.md"][:len(baseFiles["README.md"])-1]) }},
		{"a directory where a symlink to a dir was", func(up string) { file(up, "dirlink/x", "x\n", 0o644) }},
		{"a symlink where a directory was", func(up string) { symlink(up, "docs", "src") }},
		{"a whiteout below a file", func(up string) { whiteout(up, "README.md/x") }},
		{"a whiteout of a symlink, and of a missing path", func(up string) {
			whiteout(up, "link")
			whiteout(up, "never-was")
		}},
		{".git-like names", func(up string) {
			file(up, "src/.git/config", "x\n", 0o644)
			file(up, ".GIT", "x\n", 0o644)
			file(up, ".gitx", "x\n", 0o644)
			file(up, "src/.gitignore", "x\n", 0o644)
		}},
		{"bytes that need quoting", func(up string) {
			for _, p := range []string{"\x7fdel", "\x01ctl", "caf\xc3\xa9", "\xff\xfe", "sp ace/\"q\"", "x\\y", "new\nline/inner\tx"} {
				file(up, p, p, 0o644)
			}
		}},
		{"an empty file, a long symlink, an exec bit for others only", func(up string) {
			file(up, "empty", "", 0o644)
			symlink(up, "long", strings.Repeat("a/", 2000))
			file(up, "README.md", baseFiles["README.md"], 0o601)
		}},
		{"a path below a gitlink deleted", func(up string) { whiteout(up, "sub/x") }},
	}
	baseTree := treeOf(t, g, base)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gen := uint64(i + 1)
			up := builtUpper(t, f, gen, c.build)
			fast := importAnswers(t, g, up, base, baseTree)
			want := describedAsDiffTree(t, g, gen, base, baseTree, up)
			t.Logf("fast %v: %v", fast, want.Paths)
		})
	}
}
