package integration

// Issue 3 end to end through the real binary: a worktree restored to the
// last pushed state on every fence, with every abandoned edit saved under
// refs/shim/abandoned/<gen>. Real git, a checkout owned by an unprivileged
// uid, harnesses that run as that uid.

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitguard"
	"github.com/shimdev/shim/internal/testutil"
)

// wtUID owns the checkout and runs the harnesses (nobody on Debian).
const wtUID = 65534

// wtFixture is a bare origin, a checkout owned by wtUID with one pushed
// commit (the baseline), and directories outside the worktree: out (writable
// by wtUID: markers, gen 2's observations), in (inputs the harness copies
// in), bin (scripts), home (HOME of the harnesses).
type wtFixture struct {
	work, origin, wt, out, in, bin, home string
	baseline                             string
	base                                 map[string]string // files of the baseline
}

var wtBaseFiles = map[string]string{
	"README.md":      "# project\n",
	"src/main.go":    "package main\n\nfunc main() {}\n",
	"src/lib/lib.go": "package lib\n",
	"docs/guide.txt": "guide line 1\nguide line 2\n",
	"delete-me.txt":  "this file is deleted by generation 1\n",
	"bin.dat":        "\x00\x01binary\xff\xfe\r\n",
	".gitignore":     "*.log\n",
}

func newWTFixture(t *testing.T) *wtFixture {
	t.Helper()
	requireRoot(t)
	testutil.NeedTool(t, "git") // a failure, not a skip, under SHIM_REQUIRE_INTEGRATION
	work, err := os.MkdirTemp("", "shim-wt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	f := &wtFixture{work: work, origin: filepath.Join(work, "origin.git"), wt: filepath.Join(work, "wt"),
		out: filepath.Join(work, "out"), in: filepath.Join(work, "in"), bin: filepath.Join(work, "bin"),
		home: filepath.Join(work, "home"), base: wtBaseFiles}
	for _, d := range []string{f.out, f.in, f.bin, f.home} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{f.out, f.home} {
		if err := os.Chown(d, wtUID, wtUID); err != nil {
			t.Fatal(err)
		}
	}
	hgit(t, work, "init", "-q", "--bare", "-b", "main", f.origin)
	hgit(t, work, "clone", "-q", f.origin, f.wt)
	for p, c := range f.base {
		writeFile(t, filepath.Join(f.wt, p), c, 0o644)
	}
	hgit(t, f.wt, "checkout", "-q", "-b", "main")
	hgit(t, f.wt, "add", "-A")
	hgit(t, f.wt, "commit", "-qm", "initial")
	hgit(t, f.wt, "push", "-q", "origin", "main")
	f.baseline = hgit(t, f.wt, "rev-parse", "HEAD")
	chownR(t, f.wt, wtUID)
	return f
}

// hgit runs the test's own git as root, with every hook, fsmonitor and
// filter the adversarial test plants switched off, so the test never runs
// a payload itself.
func hgit(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := hgitErr(dir, args...)
	if err != nil {
		t.Fatalf("git %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return strings.TrimSpace(string(out))
}

func hgitErr(dir string, args ...string) ([]byte, error) {
	pre := []string{"-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
		"-c", "init.defaultBranch=main", "-c", "core.autocrlf=false", "--no-replace-objects"}
	for _, f := range []string{"evil", "inc"} {
		pre = append(pre, "-c", "filter."+f+".clean=", "-c", "filter."+f+".smudge=", "-c", "filter."+f+".process=",
			"-c", "filter."+f+".required=false")
	}
	cmd := exec.Command("git", append(pre, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "LC_ALL=C", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_OPTIONAL_LOCKS=0",
		"GIT_AUTHOR_NAME=supervisor", "GIT_AUTHOR_EMAIL=s@example.invalid",
		"GIT_COMMITTER_NAME=supervisor", "GIT_COMMITTER_EMAIL=s@example.invalid"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return append(out, stderr.Bytes()...), err
	}
	return out, nil
}

func writeFile(t testing.TB, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func chownR(t testing.TB, root string, uid int) { t.Helper(); testutil.ChownR(t, root, uid) }

// harnessEnv is what every generation gets: a writable HOME and a git
// identity, nothing else of the test's environment.
func (f *wtFixture) startArgs(gen int, extra ...string) []string {
	a := []string{"start", "--generation", strconv.Itoa(gen), "--user", fmt.Sprintf("%d:%d", wtUID, wtUID),
		"--worktree", f.wt, "--baseline", f.baseline,
		"--env", "HOME=" + f.home, "--env", "PATH=/usr/bin:/bin",
		"--env", "GIT_AUTHOR_NAME=agent", "--env", "GIT_AUTHOR_EMAIL=agent@example.invalid",
		"--env", "GIT_COMMITTER_NAME=agent", "--env", "GIT_COMMITTER_EMAIL=agent@example.invalid"}
	return append(a, extra...)
}

// gen2Script records what the next harness finds before it does anything.
const gen2Script = `
OUT=$1
git status --porcelain --untracked-files=all --ignored > "$OUT/gen2.status" 2>"$OUT/gen2.err"
git rev-parse HEAD > "$OUT/gen2.head" 2>>"$OUT/gen2.err"
git symbolic-ref -q HEAD > "$OUT/gen2.branch" 2>>"$OUT/gen2.err"
touch "$OUT/gen2.done"
exec sleep 1000
`

// startGen2 announces the next generation with gen2Script and waits for
// its observations; it returns the fence reports and gen 2's status output.
func (f *wtFixture) startGen2(t *testing.T, s *Shim, gen int) (api.StartResult, string) {
	t.Helper()
	g2 := script(t, f.bin, fmt.Sprintf("gen%d.sh", gen), gen2Script)
	var r api.StartResult
	s.MustCtl(&r, f.startArgs(gen, "--", g2, f.out)...)
	eventually(t, 10*time.Second, "next generation's observations", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "gen2.done"))
		return err == nil
	})
	if b, _ := os.ReadFile(filepath.Join(f.out, "gen2.err")); len(b) > 0 {
		t.Errorf("git in the next generation complained: %s", b)
	}
	head := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen2.head")))
	if head != f.baseline {
		t.Errorf("next generation found HEAD %q, want the baseline %s", head, f.baseline)
	}
	if br := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen2.branch"))); br != "refs/heads/main" {
		t.Errorf("next generation is on %q, want refs/heads/main", br)
	}
	return r, readString(t, filepath.Join(f.out, "gen2.status"))
}

func readString(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// worktreeReport decodes the fence report's worktree section.
func worktreeReport(t testing.TB, rep api.FenceReport) gitguard.Report {
	t.Helper()
	var w gitguard.Report
	b, _ := json.Marshal(rep.Worktree)
	if err := json.Unmarshal(b, &w); err != nil || rep.Worktree == nil {
		t.Fatalf("fence report has no worktree section: %s (%v)", b, err)
	}
	return w
}

// blob returns the exact bytes of path in commit.
func (f *wtFixture) blob(t testing.TB, commit, path string) (string, bool) {
	t.Helper()
	out, err := hgitErr(f.wt, "cat-file", "blob", commit+":"+path)
	if err != nil {
		return "", false
	}
	return string(out), true
}

// blobSize is the size of path in commit, -1 when it has none.
func (f *wtFixture) blobSize(t testing.TB, commit, path string) int64 {
	t.Helper()
	out, err := hgitErr(f.wt, "cat-file", "-s", commit+":"+path)
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatalf("cat-file -s %s:%s: %q", commit, path, out)
	}
	return n
}

// ownedBy reports every entry under root (the .git dir included) that the
// restore left owned by someone else than uid: a root-owned index or object
// would break the next harness's git.
func ownedBy(t testing.TB, root string, uid int) []string {
	var bad []string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
			bad = append(bad, fmt.Sprintf("%s (uid %d)", strings.TrimPrefix(p, root+"/"), st.Uid))
		}
		return nil
	})
	return bad
}

// gen1EditScript edits, deletes, adds untracked files in new dirs and an
// ignored file, commits once locally, and then keeps editing a tracked file.
const gen1EditScript = `
set -e
IN=$1 OUT=$2
cat "$IN/README.md" > README.md
git commit -qam "gen 1: local commit"
cat "$IN/main.go" > src/main.go
cat "$IN/bin.dat" > bin.dat
rm delete-me.txt
mkdir -p new/deep/dir
cat "$IN/notes.txt" > new/deep/dir/notes.txt
cat "$IN/top.txt" > new/top.txt
cat "$IN/crlf.txt" > new/crlf.txt
cat "$IN/run.sh" > new/run.sh
chmod 755 new/run.sh
cat "$IN/space.txt" > "file with space.txt"
echo "build output" > build.log
touch "$OUT/ready"
i=0
while :; do i=$((i+1)); echo "edit $i" >> docs/guide.txt; sleep 0.01; done
`

func TestWorktreeRestoredAndEditsRecoverable(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})

	inputs := map[string]string{
		"README.md": f.base["README.md"] + "a line committed locally by generation 1\n",
		"main.go":   "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"gen 1\") }\n",
		"bin.dat":   "\x00\x00\xff\x7fchanged\r\n\x00",
		"notes.txt": "untracked notes in a new directory\n",
		"top.txt":   "untracked, no trailing newline",
		"crlf.txt":  "crlf\r\nline\r\n",
		"run.sh":    "#!/bin/sh\necho run\n",
		"space.txt": "a name with spaces\n",
	}
	for n, c := range inputs {
		writeFile(t, filepath.Join(f.in, n), c, 0o644)
	}
	// What the snapshot must hold, path by path (docs/guide.txt is checked
	// separately: gen 1 is still appending to it when the fence starts).
	wantModified := map[string]string{"README.md": inputs["README.md"], "src/main.go": inputs["main.go"], "bin.dat": inputs["bin.dat"]}
	wantAdded := map[string]string{"new/deep/dir/notes.txt": inputs["notes.txt"], "new/top.txt": inputs["top.txt"],
		"new/crlf.txt": inputs["crlf.txt"], "new/run.sh": inputs["run.sh"], "file with space.txt": inputs["space.txt"]}

	g1 := script(t, f.bin, "gen1.sh", gen1EditScript)
	var r1 api.StartResult
	s.MustCtl(&r1, f.startArgs(1, "--", g1, f.in, f.out)...)
	if r1.Baseline != f.baseline {
		t.Errorf("start 1 reports baseline %q, want %s", r1.Baseline, f.baseline)
	}
	eventually(t, 10*time.Second, "gen 1 editing", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil && strings.Contains(readString(t, filepath.Join(f.wt, "docs/guide.txt")), "edit 3\n")
	})
	localCommit := hgit(t, f.wt, "rev-parse", "HEAD")
	if localCommit == f.baseline {
		t.Fatal("gen 1 did not commit")
	}

	r2, status := f.startGen2(t, s, 2)
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", status)
	}
	if len(r2.Fenced) != 1 {
		t.Fatalf("gen 2 fenced %d generations, want 1: %+v", len(r2.Fenced), r2.Fenced)
	}
	rep := r2.Fenced[0]
	if rep.Error != nil || rep.Survivors != 0 || rep.StateBefore != api.StateRunning {
		t.Errorf("fence report: %+v", rep)
	}
	if rep.SnapshotRef != "refs/shim/abandoned/1" || rep.Baseline != f.baseline || len(rep.SnapshotCommit) != 40 {
		t.Fatalf("fence report: ref %q commit %q baseline %q", rep.SnapshotRef, rep.SnapshotCommit, rep.Baseline)
	}
	if _, ok := rep.DurationsMS["restore"]; !ok {
		t.Errorf("no restore duration: %v", rep.DurationsMS)
	}
	w := worktreeReport(t, rep)
	if w.Worktree != f.wt || w.SnapshotRef != rep.SnapshotRef || w.SnapshotCommit != rep.SnapshotCommit || w.Baseline != f.baseline {
		t.Errorf("worktree section disagrees with the flat fields: %+v", w)
	}
	if w.Modified != 4 || w.Added != 5 || w.Deleted != 1 {
		t.Errorf("counts: modified %d added %d deleted %d, want 4 5 1; paths %+v", w.Modified, w.Added, w.Deleted, w.Paths)
	}
	if w.HeadBefore != localCommit || w.LocalCommits != 1 || w.SnapshotReused {
		t.Errorf("head_before %q (want %s), local_commits %d (want 1), reused %v", w.HeadBefore, localCommit, w.LocalCommits, w.SnapshotReused)
	}
	gotPaths := map[string]string{}
	for _, p := range w.Paths {
		gotPaths[p.Path] = p.Change
	}
	wantPaths := map[string]string{"README.md": "modified", "src/main.go": "modified", "bin.dat": "modified",
		"docs/guide.txt": "modified", "delete-me.txt": "deleted"}
	for p := range wantAdded {
		wantPaths[p] = "added"
	}
	if fmt.Sprint(gotPaths) != fmt.Sprint(wantPaths) {
		t.Errorf("paths:\n got %v\nwant %v", gotPaths, wantPaths)
	}
	if fmt.Sprint(w.Ignored) != "[build.log]" {
		t.Errorf("ignored: %v, want [build.log]", w.Ignored)
	}
	for _, k := range []string{"metadata", "snapshot", "clean", "reset", "verify", "total"} {
		if _, ok := w.DurationsMS[k]; !ok {
			t.Errorf("worktree section lacks duration %s: %v", k, w.DurationsMS)
		}
	}

	// Every byte gen 1 wrote is in the snapshot commit.
	c := rep.SnapshotCommit
	if got := hgit(t, f.wt, "rev-parse", "refs/shim/abandoned/1"); got != c {
		t.Errorf("refs/shim/abandoned/1 = %s, report says %s", got, c)
	}
	for p, want := range wantModified {
		if got, ok := f.blob(t, c, p); !ok || got != want {
			t.Errorf("snapshot %s = %q, want %q", p, got, want)
		}
	}
	for p, want := range wantAdded {
		if got, ok := f.blob(t, c, p); !ok || got != want {
			t.Errorf("snapshot %s = %q, want %q", p, got, want)
		}
	}
	if _, ok := f.blob(t, c, "delete-me.txt"); ok {
		t.Error("the deleted file is in the snapshot")
	}
	if _, ok := f.blob(t, c, "build.log"); ok {
		t.Error("the ignored file is in the snapshot (IncludeIgnored is off)")
	}
	if mode := strings.Fields(hgit(t, f.wt, "ls-tree", c, "new/run.sh")); len(mode) == 0 || mode[0] != "100755" {
		t.Errorf("new/run.sh lost its executable bit: %v", mode)
	}
	guide, _ := f.blob(t, c, "docs/guide.txt")
	rest, ok := strings.CutPrefix(guide, f.base["docs/guide.txt"])
	n := 0
	for ok && rest != "" {
		line := fmt.Sprintf("edit %d\n", n+1)
		if rest, ok = strings.CutPrefix(rest, line); ok {
			n++
		}
	}
	if !ok || n < 3 {
		t.Errorf("docs/guide.txt in the snapshot is not the baseline plus edit 1..edit N (N >= 3): %q", guide)
	}
	t.Logf("gen 1 had appended %d edits to docs/guide.txt when it was frozen", n)

	// The local commit is reachable from the ref; plain git recovers it all.
	if _, err := hgitErr(f.wt, "merge-base", "--is-ancestor", localCommit, "refs/shim/abandoned/1"); err != nil {
		t.Errorf("gen 1's local commit is not reachable from the snapshot ref: %v", err)
	}
	if msg := hgit(t, f.wt, "log", "--format=%s", "refs/shim/abandoned/1"); !strings.Contains(msg, "gen 1: local commit") {
		t.Errorf("git log of the ref lacks the local commit:\n%s", msg)
	}
	diff := hgit(t, f.wt, "diff", f.baseline, "refs/shim/abandoned/1")
	for _, want := range []string{"+a line committed locally by generation 1", "deleted file mode", "+untracked notes in a new directory",
		"+edit 1", "diff --git a/new/run.sh", "Binary files a/bin.dat and b/bin.dat differ"} {
		if !strings.Contains(diff, want) {
			t.Errorf("git diff <baseline> refs/shim/abandoned/1 lacks %q", want)
		}
	}

	// The worktree is the baseline, byte for byte, owned by the uid.
	for p, want := range f.base {
		if got, err := os.ReadFile(filepath.Join(f.wt, p)); err != nil || string(got) != want {
			t.Errorf("worktree %s = %q (%v), want the baseline's %q", p, got, err, want)
		}
	}
	for _, p := range []string{"new", "file with space.txt", "build.log"} {
		if _, err := os.Lstat(filepath.Join(f.wt, p)); !os.IsNotExist(err) {
			t.Errorf("%s left in the worktree: %v", p, err)
		}
	}
	if bad := ownedBy(t, f.wt, wtUID); len(bad) > 0 {
		t.Errorf("restore left entries not owned by uid %d: %v", wtUID, bad)
	}

	// shim ctl lists and shows the saved generation.
	var list struct {
		Worktree  string              `json:"worktree"`
		Snapshots []gitguard.Snapshot `json:"snapshots"`
	}
	s.MustCtl(&list, "snapshots", "--worktree", f.wt)
	if len(list.Snapshots) != 1 || list.Snapshots[0].Generation != 1 || list.Snapshots[0].Commit != c ||
		list.Snapshots[0].Ref != "refs/shim/abandoned/1" || list.Snapshots[0].Baseline != f.baseline ||
		list.Snapshots[0].HeadBefore != localCommit {
		t.Errorf("ctl snapshots: %+v", list)
	}
	s.MustCtl(&list, "snapshots") // the only registered worktree
	if len(list.Snapshots) != 1 {
		t.Errorf("ctl snapshots without --worktree: %+v", list)
	}
	var one gitguard.Snapshot
	s.MustCtl(&one, "snapshot", "--generation", "1", "--worktree", f.wt)
	if one.Commit != c || one.Modified != 4 || one.Added != 5 || one.Deleted != 1 || len(one.Paths) != 10 {
		t.Errorf("ctl snapshot --generation 1: %+v", one)
	}
	if _, errs, code := s.Ctl("snapshot", "--generation", "7", "--worktree", f.wt); code != 1 || !strings.Contains(errs, api.CodeNotFound) {
		t.Errorf("snapshot of a generation never saved: exit %d %s", code, errs)
	}
	if _, errs, code := s.Ctl("snapshots", "--worktree", "/nonexistent"); code == 0 || !strings.Contains(errs, api.CodeNotFound) {
		t.Errorf("snapshots of an unregistered worktree: exit %d %s", code, errs)
	}

	// The exit record says gen 1 was fenced.
	var exit api.Exit
	out, _, _ := s.Ctl("wait", "--generation", "1")
	if err := json.Unmarshal([]byte(out), &exit); err != nil || !exit.Fenced {
		t.Errorf("gen 1 exit record: %s", out)
	}
}

// gen1WriterScript writes f00001, f00002, ... as fast as it can, each with
// one printf (one write(2)) of a known content.
const gen1WriterScript = `
P="$1"
i=100001
while :; do
	n=${i#1}
	printf 'file %s\n%s\n' "$n" "$P" > "f$n"
	i=$((i+1))
done
`

const writerPayload = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyz"

func writerContent(n int) string { return fmt.Sprintf("file %05d\n%s\n", n, writerPayload) }

func TestWorktreeWriterStillRunningAtTheFence(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	g1 := script(t, f.bin, "writer.sh", gen1WriterScript)
	s.MustCtl(nil, f.startArgs(1, "--", g1, writerPayload)...)
	eventually(t, 20*time.Second, "the writer got going", func() bool {
		_, err := os.Stat(filepath.Join(f.wt, "f00300"))
		return err == nil
	})

	r2, status := f.startGen2(t, s, 2)
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%.2000s", status)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].SnapshotCommit == "" {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	rep := r2.Fenced[0]
	w := worktreeReport(t, rep)

	// The snapshot holds f00001..fK and nothing else, without a gap.
	names := strings.Fields(hgit(t, f.wt, "ls-tree", "--name-only", rep.SnapshotCommit))
	re := regexp.MustCompile(`^f(\d{5})$`)
	var nums []int
	for _, n := range names {
		if m := re.FindStringSubmatch(n); m != nil {
			k, _ := strconv.Atoi(m[1])
			nums = append(nums, k)
		} else if !f.inBaseline(n) {
			t.Errorf("unexpected entry %q in the snapshot", n)
		}
	}
	sort.Ints(nums)
	k := len(nums)
	if k < 300 || nums[0] != 1 || nums[k-1] != k {
		t.Fatalf("snapshot files are not a gap-free prefix f00001..f%05d: %d files, first %v last %v", k, k, nums[:min(k, 3)], nums[max(0, k-3):])
	}
	if w.Added != k || w.Modified != 0 || w.Deleted != 0 || w.PathsTruncated != (k > 1000) {
		t.Errorf("counts: added %d (want %d) modified %d deleted %d truncated %v", w.Added, k, w.Modified, w.Deleted, w.PathsTruncated)
	}
	contents := f.blobs(t, rep.SnapshotCommit, k)
	for i := 1; i < k; i++ {
		if contents[i] != writerContent(i) {
			t.Fatalf("f%05d in the snapshot is %q, want %q", i, contents[i], writerContent(i))
		}
	}
	last := contents[k]
	switch {
	case last == writerContent(k):
		t.Logf("observed: %d files saved, all complete (the last one too)", k)
	case strings.HasPrefix(writerContent(k), last):
		t.Logf("observed: %d files saved; the last one, f%05d, was cut short by the freeze (%d of %d bytes)", k, k, len(last), len(writerContent(k)))
	default:
		t.Errorf("the last file f%05d holds %q, not a prefix of its content", k, last)
	}

	// Nothing appears in the worktree after the fence.
	check := func() {
		ents, _ := os.ReadDir(f.wt)
		for _, e := range ents {
			if re.MatchString(e.Name()) {
				t.Fatalf("%s in the worktree after the fence", e.Name())
			}
		}
	}
	check()
	time.Sleep(500 * time.Millisecond)
	check()
}

// inBaseline reports whether a top-level name is a file or dir of the baseline.
func (f *wtFixture) inBaseline(name string) bool {
	for p := range f.base {
		if p == name || strings.HasPrefix(p, name+"/") {
			return true
		}
	}
	return false
}

// blobs reads f00001..fK of commit with one cat-file --batch.
func (f *wtFixture) blobs(t testing.TB, commit string, k int) map[int]string {
	t.Helper()
	var in strings.Builder
	for i := 1; i <= k; i++ {
		fmt.Fprintf(&in, "%s:f%05d\n", commit, i)
	}
	cmd := exec.Command("git", "-c", "safe.directory=*", "--no-replace-objects", "cat-file", "--batch")
	cmd.Dir = f.wt
	cmd.Env = []string{"PATH=/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME=" + f.work}
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cat-file --batch: %v", err)
	}
	r := bufio.NewReader(bytes.NewReader(out))
	res := map[int]string{}
	for i := 1; i <= k; i++ {
		hdr, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("cat-file --batch: %v", err)
		}
		fs := strings.Fields(hdr)
		if len(fs) != 3 || fs[1] != "blob" {
			t.Fatalf("f%05d: cat-file says %q", i, hdr)
		}
		size, _ := strconv.Atoi(fs[2])
		buf := make([]byte, size+1)
		if _, err := io.ReadFull(r, buf); err != nil {
			t.Fatal(err)
		}
		res[i] = string(buf[:size])
	}
	return res
}

// gen1PlantScript edits the worktree, then (with plain file writes, so no
// git of its own runs a payload) plants every way to make the shim's git run
// code: fsmonitor, hooks, core.hooksPath, filters with .gitattributes,
// include.path, core.worktree, info/attributes; and leaves the debris of a
// killed git (index.lock, a half-finished rebase).
const gen1PlantScript = `
set -e
OUT=$1
P="$OUT/payload.sh"
printf '#!/bin/sh\necho "payload $*" >> %s/marker\ncat\n' "$OUT" > "$P"
chmod 755 "$P"
echo "tracked edit" >> README.md
printf '* filter=evil diff=evil merge=evil\n*.txt filter=inc\n' > .gitattributes
printf 'before\n' >> docs/guide.txt
mkdir -p sub
printf '*.txt filter=evil\n' > sub/.gitattributes
printf 'an untracked file a filter would see\n' > sub/a.txt
for h in post-checkout reference-transaction post-index-change pre-commit post-commit; do
	printf '#!/bin/sh\n%s hook-%s\n' "$P" "$h" > ".git/hooks/$h"
	chmod 755 ".git/hooks/$h"
done
mkdir -p "$OUT/hooks"
cp .git/hooks/* "$OUT/hooks/"
cat > "$OUT/evil.config" <<EOF
[core]
	fsmonitor = $P
	hooksPath = $OUT/hooks
[filter "inc"]
	clean = $P inc-clean
	smudge = $P inc-smudge
	required = true
EOF
cat >> .git/config <<EOF
[core]
	fsmonitor = $P
	hooksPath = $OUT/hooks
	worktree = $OUT/elsewhere
[filter "evil"]
	clean = $P clean
	smudge = $P smudge
	process = $P process
	required = true
[diff "evil"]
	textconv = $P textconv
[merge "evil"]
	driver = $P merge
[include]
	path = $OUT/evil.config
EOF
mkdir -p .git/info
printf '* filter=evil\n' >> .git/info/attributes
: > .git/index.lock
mkdir -p .git/rebase-merge
echo refs/heads/main > .git/rebase-merge/head-name
touch "$OUT/ready"
exec sleep 1000
`

func TestWorktreeAdversarialGenerationRunsNothing(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	pristineConfig := readString(t, filepath.Join(f.wt, ".git/config"))
	pristineHooks := dirFiles(t, filepath.Join(f.wt, ".git/hooks"))

	g1 := script(t, f.bin, "plant.sh", gen1PlantScript)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 10*time.Second, "gen 1 planted", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	if !strings.Contains(readString(t, filepath.Join(f.wt, ".git/config")), "fsmonitor") {
		t.Fatal("gen 1 did not plant its config")
	}
	plantedAttrs := readString(t, filepath.Join(f.wt, ".gitattributes"))

	r2, status := f.startGen2(t, s, 2)
	marker := filepath.Join(f.out, "marker")
	if b, err := os.ReadFile(marker); err == nil {
		t.Errorf("a payload ran %d time(s):\n%s", strings.Count(string(b), "\n"), b)
	}
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", status)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	rep := r2.Fenced[0]
	w := worktreeReport(t, rep)

	// The git metadata is the pristine copy taken at registration.
	cfg := readString(t, filepath.Join(f.wt, ".git/config"))
	if cfg != pristineConfig {
		t.Errorf(".git/config after the fence:\n%s\nwant the pristine\n%s", cfg, pristineConfig)
	}
	kept, _ := filepath.Glob(filepath.Join(s.RuntimeDir, "worktrees", "*", "pristine", "config"))
	if len(kept) != 1 || readString(t, kept[0]) != pristineConfig {
		t.Errorf("shim's pristine copy %v differs from the config at registration", kept)
	}
	if got := dirFiles(t, filepath.Join(f.wt, ".git/hooks")); fmt.Sprint(got) != fmt.Sprint(pristineHooks) {
		t.Errorf("hooks after the fence differ from the pristine ones")
	}
	for _, p := range []string{".git/index.lock", ".git/rebase-merge", ".gitattributes", "sub"} {
		if _, err := os.Lstat(filepath.Join(f.wt, p)); !os.IsNotExist(err) {
			t.Errorf("%s left in the worktree: %v", p, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(f.wt, ".git/info/attributes")); err == nil {
		t.Errorf("planted info/attributes left: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(f.out, "elsewhere")); !os.IsNotExist(err) {
		t.Errorf("core.worktree target was touched: %v", err)
	}
	restored := strings.Join(w.MetadataRestored, " ")
	for _, want := range []string{"config", "hooks/post-checkout", "hooks/reference-transaction", "hooks/post-index-change", "info/attributes"} {
		if !strings.Contains(" "+restored+" ", " "+want+" ") {
			t.Errorf("metadata_restored %v lacks %s", w.MetadataRestored, want)
		}
	}
	cleaned := " " + strings.Join(w.Cleaned, " ") + " "
	for _, want := range []string{"index.lock", "rebase-merge"} {
		if !strings.Contains(cleaned, " "+want+" ") {
			t.Errorf("cleaned %v lacks %s", w.Cleaned, want)
		}
	}

	// The snapshot holds the planted attributes and the edits, unfiltered.
	c := rep.SnapshotCommit
	for p, want := range map[string]string{
		".gitattributes":     plantedAttrs,
		"sub/.gitattributes": "*.txt filter=evil\n",
		"sub/a.txt":          "an untracked file a filter would see\n",
		"README.md":          f.base["README.md"] + "tracked edit\n",
		"docs/guide.txt":     f.base["docs/guide.txt"] + "before\n",
	} {
		if got, ok := f.blob(t, c, p); !ok || got != want {
			t.Errorf("snapshot %s = %q, want %q", p, got, want)
		}
	}
	if w.Modified != 2 || w.Added != 3 || w.Deleted != 0 {
		t.Errorf("counts: modified %d added %d deleted %d, want 2 3 0", w.Modified, w.Added, w.Deleted)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("a payload ran (marker %s exists)", marker)
	}
}

// A replace ref left by the abandoned generation: shim's git ignores it
// (GIT_NO_REPLACE_OBJECTS), but the next harness's plain git does not.
func TestWorktreeReplaceRefDoesNotFoolTheNextGeneration(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	g1 := script(t, f.bin, "replace.sh", `
set -e
OUT=$1
echo "edit" >> README.md
fake=$(git commit-tree -m "a fake baseline" $(git mktree </dev/null))
git replace "$(git rev-parse HEAD)" "$fake"
touch "$OUT/ready"
exec sleep 1000
`)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 10*time.Second, "gen 1 planted", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	r2, status := f.startGen2(t, s, 2)
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	if got, ok := f.blob(t, r2.Fenced[0].SnapshotCommit, "README.md"); !ok || got != f.base["README.md"]+"edit\n" {
		t.Errorf("snapshot README.md = %q", got)
	}
	if status != "" {
		t.Errorf("gen 2's git sees a dirty worktree through the replace ref gen 1 left:\n%s", status)
	}
}

func dirFiles(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			out[strings.TrimPrefix(p, dir+"/")] = string(b)
		}
		return nil
	})
	return out
}

// ctlError decodes the JSON error ctl prints on stderr.
func ctlError(t testing.TB, stderr string) api.Error {
	t.Helper()
	var e api.Error
	if err := json.Unmarshal([]byte(strings.TrimSpace(stderr)), &e); err != nil {
		t.Fatalf("ctl stderr is not a JSON error: %q", stderr)
	}
	return e
}

const gen1EditAndSleep = `
OUT=$1
echo "gen 1 was here" >> README.md
echo "untracked" > gen1.txt
touch "$OUT/ready"
exec sleep 1000
`

// A baseline is resolved only once the generation it fences is dead (the
// harness could have deleted the object or broken .git to keep itself
// alive): a malformed revision is refused before anything happens (it is
// syntax, nothing is read), an unknown one fences gen 1 and fails closed
// with RESTORE_FAILED, and a good one then restores and starts.
func TestWorktreeUnknownBaselineNeverKeepsTheOldGenerationAlive(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	g1 := script(t, f.bin, "gen1.sh", gen1EditAndSleep)
	var r1 api.StartResult
	s.MustCtl(&r1, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 10*time.Second, "gen 1 ready", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	withBaseline := func(n int, rev string) []string {
		args := f.startArgs(n, "--", "true")
		for i := range args {
			if args[i] == f.baseline {
				args[i] = rev
			}
		}
		return args
	}
	_, errs, code := s.Ctl(withBaseline(2, "-x")...)
	if e := ctlError(t, errs); code != 2 || e.Code != api.CodeBadRequest {
		t.Errorf("baseline -x: exit %d, %+v; want exit 2 BAD_REQUEST", code, e)
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Generation != 1 || st.State != api.StateRunning || st.Pid != r1.Pid {
		t.Errorf("a malformed revision must change nothing: %+v", st)
	}
	for _, bad := range []string{strings.Repeat("0123456789", 4), "refs/remotes/origin/nope"} {
		_, errs, code := s.Ctl(withBaseline(2, bad)...)
		if e := ctlError(t, errs); code != 4 || e.Code != api.CodeRestoreFailed {
			t.Errorf("baseline %q: exit %d, %+v; want exit 4 RESTORE_FAILED", bad, code, e)
		}
	}
	s.MustCtl(&st, "status")
	if st.Generation != 2 || st.State != api.StateFailed || st.Pid != 0 {
		t.Errorf("status after unresolvable baselines: %+v", st)
	}
	if _, err := os.Stat(r1.Cgroup); !os.IsNotExist(err) {
		t.Errorf("gen 1 must be dead once generation 2 was announced: %v", err)
	}
	var r2 api.StartResult
	s.MustCtl(&r2, f.startArgs(2, "--", "sleep", "1000")...)
	if len(r2.Fenced) != 1 || r2.Fenced[0].SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("retry with a good baseline: %+v", r2.Fenced)
	}
	if strings.Contains(readString(t, filepath.Join(f.wt, "README.md")), "gen 1 was here") {
		t.Error("the worktree was not restored")
	}
}

// Generation 1 moves .git out of the worktree and leaves a gitfile pointing
// there: the fence must kill it, refuse to restore (fail closed), start
// nothing, and succeed once the worktree is repaired.
func TestWorktreeThatCannotBeRestoredFailsClosed(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	g1 := script(t, f.bin, "gen1.sh", `
set -e
OUT=$1
echo "gen 1 was here" >> README.md
echo "untracked" > gen1.txt
mv .git "$OUT/stolen.git"
printf 'gitdir: %s\n' "$OUT/stolen.git" > .git
touch "$OUT/ready"
exec sleep 1000
`)
	var r1 api.StartResult
	s.MustCtl(&r1, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 10*time.Second, "gen 1 ready", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})

	g2 := script(t, f.bin, "gen2.sh", gen2Script)
	out, errs, code := s.Ctl(f.startArgs(2, "--", g2, f.out)...)
	e := ctlError(t, errs)
	if code != 4 || (e.Code != api.CodeRestoreFailed && e.Code != api.CodeWorktreeRefused) {
		t.Fatalf("announcing gen 2 over an unrestorable worktree: exit %d, stdout %q, error %+v; want exit 4 RESTORE_FAILED or WORKTREE_REFUSED", code, out, e)
	}
	if !strings.Contains(e.Message, "outside the worktree") {
		t.Errorf("the error does not say why: %s", e.Message)
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.State != api.StateFailed || st.Error == nil || st.Pid != 0 {
		t.Errorf("status after the failed fence: %+v", st)
	}
	if _, err := os.Stat(filepath.Join(f.out, "gen2.done")); err == nil {
		t.Error("gen 2 started although the restore failed")
	}
	// Gen 1 is dead all the same: only shim is left.
	eventually(t, 5*time.Second, "only shim left", func() bool { return len(s.PidnsProcs()) == 1 })

	// Repair (put .git back) and announce again: the fence completes.
	if err := os.Remove(filepath.Join(f.wt, ".git")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(f.out, "stolen.git"), filepath.Join(f.wt, ".git")); err != nil {
		t.Fatal(err)
	}
	r3, status := f.startGen2(t, s, 3)
	if status != "" {
		t.Errorf("gen 3 found a dirty worktree:\n%s", status)
	}
	if len(r3.Fenced) != 1 || r3.Fenced[0].Generation != 1 || r3.Fenced[0].Error != nil || r3.Fenced[0].SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("gen 3's fence: %+v", r3.Fenced)
	}
	c := r3.Fenced[0].SnapshotCommit
	if got, _ := f.blob(t, c, "gen1.txt"); got != "untracked\n" {
		t.Errorf("gen 1's untracked file not saved: %q", got)
	}
	if got, _ := f.blob(t, c, "README.md"); got != f.base["README.md"]+"gen 1 was here\n" {
		t.Errorf("gen 1's edit not saved: %q", got)
	}
	var st3 api.Status // a fresh value: omitted fields must not keep the old ones
	s.MustCtl(&st3, "status")
	if st3.State != api.StateRunning || st3.Generation != 3 || st3.Error != nil || st3.Pid != r3.Pid {
		t.Errorf("status after the repaired fence: %+v", st3)
	}
}

// Generation 1 writes garbage into .git/config, so that any git reading it
// dies. The fence puts the pristine config back before git runs, so this
// must neither stop the fence nor leave gen 1 running.
func TestWorktreeBrokenConfigDoesNotStopTheFence(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	g1 := script(t, f.bin, "gen1.sh", `
OUT=$1
echo "gen 1 was here" >> README.md
printf '[core\n\tthis is not a config\n' >> .git/config
touch "$OUT/ready"
exec sleep 1000
`)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 10*time.Second, "gen 1 ready", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	if _, err := hgitErr(f.wt, "status"); err == nil {
		t.Fatal("the planted config does not break git; the test proves nothing")
	}
	r2, status := f.startGen2(t, s, 2)
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", status)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil || r2.Fenced[0].Baseline != f.baseline {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	if r2.Baseline != f.baseline {
		t.Errorf("gen 2's baseline %q, want %s", r2.Baseline, f.baseline)
	}
	if got, _ := f.blob(t, r2.Fenced[0].SnapshotCommit, "README.md"); got != f.base["README.md"]+"gen 1 was here\n" {
		t.Errorf("gen 1's edit not saved: %q", got)
	}
}

// An untracked directory holding its own repository is recorded as a
// gitlink (its HEAD commit) and listed in nested_repos; its files and
// history are not saved, and the clean removes it. This pins the documented
// behaviour (docs/worktree.md).
func TestWorktreeNestedRepository(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	g1 := script(t, f.bin, "nested.sh", `
set -e
OUT=$1
git init -q vendored
cd vendored
echo committed > a.txt
git add a.txt
git commit -qm "nested commit"
git rev-parse HEAD > "$OUT/nested.head"
echo uncommitted > b.txt
cd ..
echo "edit" >> README.md
touch "$OUT/ready"
exec sleep 1000
`)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 10*time.Second, "gen 1 ready", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	nestedHead := strings.TrimSpace(readString(t, filepath.Join(f.out, "nested.head")))
	r2, status := f.startGen2(t, s, 2)
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", status)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	w := worktreeReport(t, r2.Fenced[0])
	if fmt.Sprint(w.NestedRepos) != "[vendored]" {
		t.Errorf("nested_repos %v, want [vendored]", w.NestedRepos)
	}
	if got := strings.Fields(hgit(t, f.wt, "ls-tree", r2.Fenced[0].SnapshotCommit, "vendored")); len(got) < 3 || got[0] != "160000" || got[2] != nestedHead {
		t.Errorf("snapshot entry for vendored: %v, want a gitlink to %s", got, nestedHead)
	}
	if _, err := os.Lstat(filepath.Join(f.wt, "vendored")); !os.IsNotExist(err) {
		t.Errorf("the nested repository is still in the worktree: %v", err)
	}
}

// A nested repository with no commit yet: git add refuses it, so it is left
// out of the snapshot and moved into <gitdir>/shim-nested/<gen>/ instead.
func TestWorktreeNestedRepositoryWithoutCommit(t *testing.T) {
	f := newWTFixture(t)
	s := startShim(t, shimOpts{})
	g1 := script(t, f.bin, "nested.sh", `
set -e
OUT=$1
git init -q scratch
echo notes > scratch/notes.txt
echo "edit" >> README.md
touch "$OUT/ready"
exec sleep 1000
`)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 10*time.Second, "gen 1 ready", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	r2, status := f.startGen2(t, s, 2)
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", status)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	w := worktreeReport(t, r2.Fenced[0])
	if fmt.Sprint(w.NestedRepos) != "[scratch]" {
		t.Errorf("nested_repos %v, want [scratch]", w.NestedRepos)
	}
	if got, _ := f.blob(t, r2.Fenced[0].SnapshotCommit, "README.md"); got != f.base["README.md"]+"edit\n" {
		t.Errorf("gen 1's edit not saved: %q", got)
	}
	// The repository and its files were moved into the git dir, not lost.
	moved := filepath.Join(f.wt, ".git", "shim-nested", "1")
	if w.NestedReposMovedTo != moved {
		t.Errorf("nested_repos_moved_to %q, want %q", w.NestedReposMovedTo, moved)
	}
	if got := readString(t, filepath.Join(moved, "scratch", "notes.txt")); got != "notes\n" {
		t.Errorf("moved scratch/notes.txt = %q", got)
	}
	if _, err := os.Lstat(filepath.Join(f.wt, "scratch")); !os.IsNotExist(err) {
		t.Errorf("the nested repository is still in the worktree: %v", err)
	}
}

// gen1PushScript commits and pushes to the remote with the broker's
// credentials, then points .git/config's origin elsewhere and leaves an
// uncommitted edit.
const gen1PushScript = `
set -e
OUT=$1
echo "pushed by generation 1" >> README.md
git commit -qam "gen 1: pushed before the fence"
git rev-parse HEAD > "$OUT/pushed.tmp"
git push -q origin HEAD:main 2> "$OUT/push.err"
mv "$OUT/pushed.tmp" "$OUT/pushed"
git remote set-url origin http://127.0.0.1:1/decoy.git
echo "not pushed" >> docs/guide.txt
touch "$OUT/ready"
exec sleep 1000
`

// TestWorktreeFetchReportsPushesOfTheFencedGeneration: gen 1 pushes a commit
// over smart HTTP with basic auth (credentials from shim's broker); gen 2 is
// announced with --fetch and the same credential file. The fence's restore
// fetches main with the registered URL (not the one gen 1 left), reports
// remote_moved with gen 1's commit, gen 2 finds the worktree at the
// baseline, nothing in the remote is rewritten, and the secret is nowhere in
// the runtime dir, the worktree or shim's log.
func TestWorktreeFetchReportsPushesOfTheFencedGeneration(t *testing.T) {
	f, srv, pw, cf := newFetchFixture(t, "fetch")

	rd := credDir(t, -1) // the harness must reach cred.sock
	s := startShim(t, shimOpts{runtimeDir: rd})

	// A fetch without a worktree is refused before anything happens.
	for _, args := range [][]string{
		{"fence", "--generation", "5", "--fetch"},
		{"start", "--generation", "5", "--fetch-branch", "main", "--", "/bin/true"},
	} {
		if _, stderr, code := s.Ctl(args...); code != 2 || ctlError(t, stderr).Code != api.CodeBadRequest {
			t.Errorf("ctl %v: exit %d, %s; want 2 BAD_REQUEST", args, code, stderr)
		}
	}

	g1 := script(t, f.bin, "push.sh", gen1PushScript)
	s.MustCtl(nil, f.startArgs(1, "--credential-file", cf, "--", g1, f.out)...)
	eventually(t, 30*time.Second, "gen 1 pushed", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	pushed := strings.TrimSpace(readString(t, filepath.Join(f.out, "pushed")))
	if got := srv.Git(t, "rev-parse", "refs/heads/main"); got != pushed {
		t.Fatalf("the server's main is %s, want gen 1's push %s", got, pushed)
	}
	before := len(srv.Requests())

	g2 := script(t, f.bin, "gen2.sh", gen2Script)
	var r2 api.StartResult
	s.MustCtl(&r2, f.startArgs(2, "--fetch", "--credential-file", cf, "--", g2, f.out)...)
	eventually(t, 10*time.Second, "gen 2's observations", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "gen2.done"))
		return err == nil
	})
	if st := readString(t, filepath.Join(f.out, "gen2.status")); st != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", st)
	}
	if head := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen2.head"))); head != f.baseline {
		t.Errorf("gen 2 found HEAD %s, want the baseline %s", head, f.baseline)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	w := worktreeReport(t, r2.Fenced[0])
	fr := w.Fetch
	if fr == nil {
		t.Fatalf("worktree section has no fetch: %+v", w)
	}
	b, _ := json.MarshalIndent(fr, "", "  ")
	t.Logf("fetch: %s", b)
	if fr.Error != "" || !fr.Authenticated {
		t.Errorf("fetch error %q, authenticated %v", fr.Error, fr.Authenticated)
	}
	if fr.Remote != "origin" || fr.Branch != "main" || fr.URL != srv.URL || fr.Ref != "refs/shim/remote/origin/main" {
		t.Errorf("remote %q branch %q url %q ref %q", fr.Remote, fr.Branch, fr.URL, fr.Ref)
	}
	if !fr.RemoteMoved || fr.FetchedCommit != pushed || fr.Baseline != f.baseline || fr.RemoteCommitCount != 1 || len(fr.RemoteCommits) != 1 ||
		fr.RemoteCommits[0] != (gitguard.RemoteCommit{Commit: pushed, Subject: "gen 1: pushed before the fence"}) {
		t.Errorf("remote_moved %v fetched %s commits %d %+v; want gen 1's %s", fr.RemoteMoved, fr.FetchedCommit, fr.RemoteCommitCount, fr.RemoteCommits, pushed)
	}
	if _, ok := w.DurationsMS["fetch"]; !ok {
		t.Errorf("no fetch duration: %v", w.DurationsMS)
	}
	// The fetch authenticated as bot and only read; the remote is unchanged;
	// the worktree's refs/shim/remote has the commit, refs/remotes does not.
	fetched := false
	for _, r := range srv.Requests()[before:] {
		if r.ReceivePack() || strings.Contains(r.Path, "git-receive-pack") {
			t.Errorf("the fence wrote to the remote: %+v", r)
		}
		fetched = fetched || (r.User == "bot" && r.Status == 200 && strings.HasSuffix(r.Path, "/git-upload-pack"))
	}
	if !fetched {
		t.Errorf("no authenticated upload-pack request during the fence: %+v", srv.Requests()[before:])
	}
	if got := srv.Git(t, "rev-parse", "refs/heads/main"); got != pushed {
		t.Errorf("the server's main moved to %s", got)
	}
	if got := hgit(t, f.wt, "rev-parse", "refs/shim/remote/origin/main"); got != pushed {
		t.Errorf("refs/shim/remote/origin/main = %s", got)
	}
	if got := hgit(t, f.wt, "config", "remote.origin.url"); got != srv.URL {
		t.Errorf("origin url after the fence: %s", got)
	}
	if bad := ownedBy(t, f.wt, wtUID); len(bad) > 0 {
		t.Errorf("not owned by uid %d after the fetch: %v", wtUID, bad)
	}
	if recs := credFind(credAudit(t, rd), "worktree_fetched", map[string]any{"remote_moved": true, "fetched_commit": pushed}); len(recs) != 1 {
		t.Errorf("audit worktree_fetched records: %v", recs)
	}

	credStopShim(t, s)
	basic := base64.StdEncoding.EncodeToString([]byte("bot:" + pw))
	credScanForSecrets(t, []string{pw, basic}, map[string]string{"shim log": s.Log.String()}, rd, f.wt, f.out, f.home)
}

// TestWorktreeFetchContinueStartsFromWhatWasPushed: with --fetch-continue,
// gen 2 starts on the commit gen 1 pushed (the fence's fetch found it on
// the remote), not on the baseline named; gen 1's unpushed edit is in its
// snapshot, not in gen 2's worktree.
func TestWorktreeFetchContinueStartsFromWhatWasPushed(t *testing.T) {
	f, _, _, cf := newFetchFixture(t, "continue")
	s := startShim(t, shimOpts{runtimeDir: credDir(t, -1)})

	g1 := script(t, f.bin, "push.sh", gen1PushScript)
	s.MustCtl(nil, f.startArgs(1, "--credential-file", cf, "--", g1, f.out)...)
	eventually(t, 30*time.Second, "gen 1 pushed", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	pushed := strings.TrimSpace(readString(t, filepath.Join(f.out, "pushed")))
	g2 := script(t, f.bin, "gen2.sh", gen2Script)
	var r2 api.StartResult
	s.MustCtl(&r2, f.startArgs(2, "--fetch", "--fetch-continue", "--credential-file", cf, "--", g2, f.out)...)
	eventually(t, 10*time.Second, "gen 2's observations", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "gen2.done"))
		return err == nil
	})
	if head := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen2.head"))); head != pushed || r2.Baseline != pushed {
		t.Errorf("gen 2 found HEAD %s (start result baseline %s), want gen 1's push %s", head, r2.Baseline, pushed)
	}
	if st := readString(t, filepath.Join(f.out, "gen2.status")); st != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", st)
	}
	w := r2.Fenced[0].Worktree
	if w == nil || !w.BaselineFromFetch || w.Baseline != pushed {
		t.Fatalf("worktree report: %+v", w)
	}
	if got := hgit(t, f.wt, "show", w.SnapshotRef+":docs/guide.txt"); !strings.Contains(got, "not pushed") {
		t.Errorf("gen 1's unpushed edit is not in its snapshot: %q (commit %s %s; log %s)", got, w.SnapshotCommit,
			hgit(t, f.wt, "rev-parse", w.SnapshotRef), hgit(t, f.wt, "log", "--oneline", "-3", w.SnapshotRef))
	}
}

// newFetchFixture is a worktree whose origin is a smart-HTTP server at the
// baseline (no userinfo in the URL: the secret only ever comes from shim),
// the password of its account "bot", and a credential file for it.
func newFetchFixture(t *testing.T, secret string) (f *wtFixture, srv *gitServer, pw, cf string) {
	t.Helper()
	f = newWTFixture(t)
	pw = credSecret(secret)
	srv = startGitServer(t, gitServerOpts{Addr: "127.0.0.1:0", Accounts: map[string]gitAccount{"bot": {Password: pw, Branch: "main"}}})
	hgit(t, f.wt, "push", "-q", "-f", srv.Bare, "main")
	hgit(t, f.wt, "remote", "set-url", "origin", srv.URL)
	hgit(t, f.wt, "fetch", "-q", f.origin)
	chownR(t, f.wt, wtUID)
	cf = credFile(t, []map[string]string{{"protocol": "http", "host": srv.HostPort, "path": "repo.git", "username": "bot", "password": pw}})
	return f, srv, pw, cf
}
