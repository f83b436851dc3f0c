// Package testutil is shim's one test kit: the skip-or-fatal rule of
// SHIM_REQUIRE_INTEGRATION, finding the cgroup2 mount, removing a cgroup
// subtree a test made, and a git smart-HTTP server (StartGitServer). Tests
// of every package use it; nothing else does.
package testutil

import (
	"os"
	"os/exec"
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

// RemoveCgroupTree kills and removes a cgroup2 subtree the test created
// (sandbox.RemoveCgroupTree).
func RemoveCgroupTree(root string) { sandbox.RemoveCgroupTree(root) }
