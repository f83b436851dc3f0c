package gitformat

import (
	"bytes"
	"compress/zlib"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A realRepo is what git itself wrote for a small history (a file in
// three versions, a directory, a symlink, an annotated tag): its loose
// objects (file bytes by name, and inflated), then the same objects
// repacked with deltas; its refs, packed.
type realRepo struct {
	loose    map[string][]byte // name: the loose file's bytes (zlib)
	inflated map[string][]byte // name: header and object
	pack     []byte
	idx      []byte
	refs     []byte // packed-refs (a peeled tag among them)
	head     []byte // HEAD, a symbolic ref
}

// gitRepo is the real repository, or nil where git is not here.
func gitRepo(tb testing.TB) *realRepo {
	tb.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		return nil
	}
	dir := tb.TempDir()
	run := func(args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=f", "-c", "user.email=f@f", "-c", "init.defaultBranch=main"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	run("init", "-q")
	body := bytes.Repeat([]byte("a line of the file that deltas share\n"), 40)
	for i := 0; i < 3; i++ {
		body = append(body, []byte("version "+strconv.Itoa(i)+"\n")...)
		must(tb, os.WriteFile(filepath.Join(dir, "f.txt"), body, 0o644))
		must(tb, os.MkdirAll(filepath.Join(dir, "d"), 0o755))
		must(tb, os.WriteFile(filepath.Join(dir, "d", "g"+strconv.Itoa(i)), []byte("g\n"), 0o755))
		run("add", "-A")
		run("commit", "-qm", "v"+strconv.Itoa(i))
	}
	must(tb, os.Symlink("f.txt", filepath.Join(dir, "link")))
	run("add", "-A")
	run("commit", "-qm", "a link")
	run("tag", "-a", "-m", "a tag", "t1")
	r := &realRepo{loose: map[string][]byte{}, inflated: map[string][]byte{}}
	objs := filepath.Join(dir, ".git", "objects")
	filepath.WalkDir(objs, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(objs, p)
		if err != nil || d.IsDir() || len(rel) != 41 || rel[2] != '/' {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		id := strings.Replace(rel, "/", "", 1)
		r.loose[id] = b
		r.inflated[id] = inflated(tb, b)
		return nil
	})
	run("repack", "-adfq", "--depth=5")
	packs, _ := filepath.Glob(filepath.Join(objs, "pack", "pack-*.pack"))
	if len(packs) != 1 || len(r.loose) < 10 {
		tb.Fatalf("git wrote %d packs, %d loose objects", len(packs), len(r.loose))
	}
	run("pack-refs", "--all")
	r.refs, _ = os.ReadFile(filepath.Join(dir, ".git", "packed-refs"))
	r.head, _ = os.ReadFile(filepath.Join(dir, ".git", "HEAD"))
	r.pack, _ = os.ReadFile(packs[0])
	r.idx, _ = os.ReadFile(strings.TrimSuffix(packs[0], ".pack") + ".idx")
	return r
}

// bodies is the bodies of the repository's loose objects of type name.
func (r *realRepo) bodies(name string) [][]byte {
	var out [][]byte
	for _, b := range r.inflated {
		if hdr, body, ok := bytes.Cut(b, []byte{0}); ok && strings.HasPrefix(string(hdr), name+" ") {
			out = append(out, body)
		}
	}
	return out
}

func inflated(tb testing.TB, z []byte) []byte {
	tb.Helper()
	b, err := inflateAll(z, 1<<30)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func zlibOf(b []byte) []byte {
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
