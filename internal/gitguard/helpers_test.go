package gitguard

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// testEnv is the environment of the (unhardened) git the tests use to build
// repositories: isolated from the machine's configuration.
func testEnv(home string) []string {
	return []string{
		"PATH=/usr/bin:/bin", "HOME=" + home, "LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_OPTIONAL_LOCKS=0", "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=safe.directory", "GIT_CONFIG_VALUE_0=*",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t",
	}
}

// tgit runs plain git in dir for test setup and fails the test on error.
func tgit(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := tgitErr(dir, args...)
	if err != nil {
		t.Fatalf("git %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return strings.TrimSpace(out)
}

func tgitErr(dir string, args ...string) (string, error) {
	pre := []string{"-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*", "-c", "core.fsmonitor=false"}
	// The filter drivers the adversarial tests plant: never run them here.
	for _, f := range []string{"evil", "proc", "inc", "lfsish"} {
		pre = append(pre, "-c", "filter."+f+".clean=", "-c", "filter."+f+".smudge=", "-c", "filter."+f+".process=", "-c", "filter."+f+".required=false")
	}
	cmd := exec.Command("/usr/bin/git", append(pre, args...)...)
	cmd.Dir = dir
	cmd.Env = testEnv(os.TempDir())
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	return b.String(), err
}

// fixture is a bare origin, a clone (the worktree) and the pushed baseline.
type fixture struct {
	root, origin, wt, state string
	baseline                string
	outside                 string // a directory outside the worktree for payload markers
	baseContent             map[string]string
	eolAgnostic             bool // compare worktree files with CRLF read as LF
}

// files of the initial commit.
var baseFiles = map[string]string{
	"README.md":        "# test\n",
	"src/main.go":      "package main\n\nfunc main() {}\n",
	"src/lib/util.go":  "package lib\n",
	"docs/guide.txt":   "line 1\nline 2\n",
	".gitignore":       "*.log\nbuild/\n",
	"script.sh":        "#!/bin/sh\necho hi\n",
	"data/keep/a.txt":  "a\n",
	"data/keep/b.txt":  "b\n",
	"dir with space/x": "x\n",
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	root := t.TempDir()
	// t.TempDir may itself be reached through a symlink on some systems.
	if r, err := filepath.EvalSymlinks(root); err == nil {
		root = r
	}
	f := &fixture{root: root, origin: filepath.Join(root, "origin.git"), wt: filepath.Join(root, "wt"),
		state: filepath.Join(root, "state"), outside: filepath.Join(root, "outside")}
	must(t, os.MkdirAll(f.outside, 0o777))
	// Let a worktree owned by another uid be reached (t.TempDir is 0700).
	for d := root; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		must(t, os.Chmod(d, 0o755))
	}
	tgit(t, root, "init", "-q", "--bare", f.origin)
	tgit(t, root, "clone", "-q", f.origin, f.wt)
	for p, c := range baseFiles {
		writeFile(t, filepath.Join(f.wt, p), c)
	}
	must(t, os.Chmod(filepath.Join(f.wt, "script.sh"), 0o755))
	tgit(t, f.wt, "add", "-A")
	tgit(t, f.wt, "commit", "-q", "-m", "base")
	tgit(t, f.wt, "push", "-q", "origin", "main")
	f.baseline = tgit(t, f.wt, "rev-parse", "HEAD")
	f.baseContent = map[string]string{}
	for p, c := range baseFiles {
		f.baseContent[p] = c
	}
	return f
}

func (f *fixture) guard(t testing.TB, mod func(*Config)) *Guard {
	t.Helper()
	cfg := Config{Worktree: f.wt, StateDir: f.state, Git: "/usr/bin/git"}
	if mod != nil {
		mod(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Register(context.Background()); err != nil {
		t.Fatalf("register: %v", err)
	}
	return g
}

func writeFile(t testing.TB, p, c string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(c), 0o644))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func statUID(info fs.FileInfo) int {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
