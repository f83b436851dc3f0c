// Package testutil is shim's one test kit: the skip-or-fatal rule of
// SHIM_REQUIRE_INTEGRATION, finding the cgroup2 mount, removing a cgroup
// subtree a test made, and a git smart-HTTP server (StartGitServer). Tests
// of every package use it; nothing else does.
package testutil

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/shimdev/shim/internal/sandbox"
)

// Strict reports whether integration tests must run (CI sets
// SHIM_REQUIRE_INTEGRATION=1): a test that would skip fails instead.
func Strict() bool { return os.Getenv("SHIM_REQUIRE_INTEGRATION") == "1" }

// Need skips t when ok is false, or fails it under Strict, saying why.
func Need(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if Strict() {
		t.Fatalf("cannot run (%s) but SHIM_REQUIRE_INTEGRATION=1", why)
	}
	t.Skip(why)
}

// NeedRoot needs root.
func NeedRoot(t testing.TB) { t.Helper(); Need(t, os.Geteuid() == 0, "needs root") }

// NeedTool needs the program name on PATH and returns its path.
func NeedTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	Need(t, err == nil, name+" not found")
	return p
}

// Cgroup2Mount is the cgroup2 mount (sandbox.Cgroup2Mount).
func Cgroup2Mount() string { return sandbox.Cgroup2Mount() }

// HarnessDir makes a temporary dir a harness uid can traverse (mode 0755;
// owned by uid when uid >= 0) and removes it when the test ends.
func HarnessDir(t testing.TB, uid int) string {
	t.Helper()
	d, err := os.MkdirTemp("", "shim-it-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if uid >= 0 {
		if err := os.Chown(d, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// ChownR gives root and everything below it (never through a symlink) to
// uid:uid.
func ChownR(t testing.TB, root string, uid int) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}
