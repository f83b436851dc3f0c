package integration

import (
	"bufio"
	"bytes"
	"github.com/shimdev/shim/internal/testutil"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The binary's own verbs, as a person meets them.

func TestCLIVersionIsStamped(t *testing.T) {
	out, err := exec.Command(shimBin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.TrimSpace(string(out))
	if got == "shim dev" || !strings.HasPrefix(got, "shim ") {
		t.Fatalf("shim version: %q; scripts/build stamps it", got)
	}
	// scripts/build (TestMain) stamps git describe of this checkout as it
	// was then (HEAD may have moved since): a commit of this repository,
	// "-dirty" when the tree was.
	if exec.Command("git", "-C", "..", "rev-parse", "--git-dir").Run() != nil {
		return
	}
	rev := strings.TrimSuffix(strings.TrimPrefix(got, "shim "), "-dirty")
	if i := strings.LastIndex(rev, "-g"); i >= 0 {
		rev = rev[i+2:]
	}
	if err := exec.Command("git", "-C", "..", "rev-parse", "--verify", "--quiet", rev+"^{commit}").Run(); err != nil {
		t.Errorf("shim version %q does not name a commit of this checkout (git describe --always --dirty)", got)
	}
}

func TestCLIInitAsNonRootSaysRoot(t *testing.T) {
	requireRoot(t) // to become someone else
	cmd := exec.Command(shimBin, "init", "--runtime-dir", filepath.Join(t.TempDir(), "rd"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: wtUID, Gid: wtUID, Groups: []uint32{}}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	msg := strings.TrimSpace(stderr.String())
	if !ok || ee.ExitCode() != 1 || !strings.Contains(msg, "must run as root") || len(msg) > 300 || strings.Count(msg, "\n") > 0 {
		t.Errorf("shim init as uid %d: %v, stderr (%d bytes) %q", wtUID, err, len(msg), msg)
	}
}

func TestCLIDemoHelpRunsNothing(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		out, err := exec.Command(shimBin, "demo", arg).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "usage: shim demo") || strings.Contains(string(out), "==>") {
			t.Errorf("shim demo %s: %v %q", arg, err, out)
		}
	}
	out, err := exec.Command(shimBin, "demo", "--bogus").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || strings.Contains(string(out), "==>") {
		t.Errorf("shim demo --bogus: %v %q", err, out)
	}
}

// A demo whose output is closed (shim demo | head) or that is told to stop
// removes what it made: its shim, its cgroup subtree, its runtime dir and
// its repository.
func TestCLIDemoCleansUpWhenStopped(t *testing.T) {
	requireRoot(t)
	testutil.NeedTool(t, "git") // a failure, not a skip, under SHIM_REQUIRE_INTEGRATION
	for _, tc := range []struct {
		name string
		stop func(*exec.Cmd, *os.File)
		code int
	}{
		{"SIGPIPE", func(_ *exec.Cmd, r *os.File) { r.Close() }, 128 + int(syscall.SIGPIPE)},
		{"SIGTERM", func(c *exec.Cmd, _ *os.File) { c.Process.Signal(syscall.SIGTERM) }, 128 + int(syscall.SIGTERM)},
		{"SIGINT", func(c *exec.Cmd, _ *os.File) { c.Process.Signal(syscall.SIGINT) }, 128 + int(syscall.SIGINT)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(shimBin, "demo")
			cmd.Stdout = w
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			w.Close()
			exited := make(chan struct{}) // closed once waitErr is set
			var waitErr error
			go func() { waitErr = cmd.Wait(); close(exited) }()
			var made []string
			t.Cleanup(func() {
				// A failed test still leaves nothing: the demo's own
				// cleanup first, then whatever it could not remove.
				cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(time.Minute):
					cmd.Process.Kill()
				}
				for _, p := range made {
					if strings.HasPrefix(p, cgroup2Mount()) {
						removeCgroupTree(t, p)
					} else {
						os.RemoveAll(p)
					}
				}
			})
			// Read until the demo has made all it makes: its shim and
			// cgroups (the "runtime dir" line) and its repository.
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				line := sc.Text()
				if rd, rest, ok := strings.Cut(strings.TrimPrefix(line, "    runtime dir "), ", cgroup root "); ok && rd != line {
					made = append(made, rd, strings.TrimSuffix(strings.Fields(rest)[0], ","))
				}
				if _, wt, ok := strings.Cut(line, "a checkout at "); ok {
					made = append(made, filepath.Dir(strings.TrimSuffix(strings.Fields(wt)[0], ";")))
					break
				}
			}
			if len(made) != 3 {
				t.Fatalf("the demo did not say what it made: %v (%v)\n%s", made, sc.Err(), stderr.String())
			}
			for _, p := range made {
				if _, err := os.Stat(p); err != nil {
					t.Fatalf("%s: %v", p, err)
				}
			}
			tc.stop(cmd, r)
			go func() { // keeps the pipe drained unless it is closed
				for sc.Scan() {
				}
			}()
			select {
			case <-exited:
			case <-time.After(2 * time.Minute):
				t.Fatal("the demo did not stop")
			}
			if ee, ok := waitErr.(*exec.ExitError); !ok || ee.ExitCode() != tc.code {
				t.Errorf("exit: %v, want %d\n%s", waitErr, tc.code, stderr.String())
			}
			for _, p := range made {
				if _, err := os.Stat(p); !os.IsNotExist(err) {
					t.Errorf("%s left behind (%v)", p, err)
				}
			}
		})
	}
}
