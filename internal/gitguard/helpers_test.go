package gitguard

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// testEnv is the environment of the (unhardened) git the tests use to build
// repositories: isolated from the machine's configuration.
func testEnv(home string) []string {
	return []string{
		"PATH=/usr/bin:/bin", "HOME=" + home, "LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
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
	cmd := exec.Command("/usr/bin/git", append([]string{"-c", "init.defaultBranch=main", "-c", "core.hooksPath=/dev/null"}, args...)...)
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
