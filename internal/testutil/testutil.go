// Package testutil is shim's one test kit: the skip-or-fatal rule of
// SHIM_REQUIRE_INTEGRATION, finding the cgroup2 mount, and removing a cgroup
// subtree a test made. Tests of every package use it; nothing else does.
package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
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

// Cgroup2Mount is the cgroup2 mount: /sys/fs/cgroup on a pure cgroup2
// host, /sys/fs/cgroup/unified on a hybrid one; "" when there is none.
func Cgroup2Mount() string {
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st syscall.Statfs_t
		if syscall.Statfs(m, &st) == nil && st.Type == 0x63677270 {
			return m
		}
	}
	return ""
}

// RemoveCgroupTree kills whatever is left in a cgroup subtree the test
// created (cgroup.kill, cgroup2 only) and removes it, leaves first. It
// never touches anything outside root.
func RemoveCgroupTree(root string) {
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		os.WriteFile(filepath.Join(dirs[i], "cgroup.kill"), []byte("1"), 0)
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := os.Remove(dirs[i])
			if err == nil || os.IsNotExist(err) || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond) // the kernel empties the cgroup
		}
	}
}
