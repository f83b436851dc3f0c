package layers

import (
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// socketPair is shim's end (a UnixConn) and the stub's (a raw fd).
func socketPair(t *testing.T) (*net.UnixConn, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "shim")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); unix.Close(fds[1]) })
	return c.(*net.UnixConn), fds[1]
}

// tempFile is an output file of the test's, closed after it.
func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// What Send gives a stub is what it receives: the plan, the command, an
// environment larger than one read, and the two output files, whose
// writes land where shim's ends of them are.
func TestALaunchArrivesWholeWithItsOutputFiles(t *testing.T) {
	c, fd := socketPair(t)
	out := tempFile(t)
	big := "BIG=" + strings.Repeat("x", 200<<10) // several reads of the stub's 64 KiB
	m := Launch{Plan: &Plan{Generation: 7, Cwd: "/w", UID: 1000, SetCred: true,
		Worktrees: []WorktreeLayer{{Path: "/w", Upper: "/l/u", Work: "/l/w"}}},
		Path: "/bin/sh", Argv: []string{"sh", "-c", "true"}, Env: []string{"A=1", big}}
	go func() {
		if err := Send(c, m, out, out); err != nil {
			t.Error(err)
		}
	}()
	got, files, err := receiveLaunch(fd)
	if err != nil {
		t.Fatal(err)
	}
	if got.Plan.Generation != 7 || got.Plan.Cwd != "/w" || got.Plan.UID != 1000 || !got.Plan.SetCred ||
		len(got.Plan.Worktrees) != 1 || got.Plan.Worktrees[0].Upper != "/l/u" ||
		got.Path != "/bin/sh" || strings.Join(got.Argv, " ") != "sh -c true" || len(got.Env) != 2 || got.Env[1] != big {
		t.Fatalf("received %+v (plan %+v)", got, got.Plan)
	}
	if len(files) != 2 {
		t.Fatalf("files %v", files)
	}
	if _, err := unix.Write(files[1], []byte("from the stub")); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		unix.Close(f)
	}
	if b, _ := os.ReadFile(out.Name()); string(b) != "from the stub" {
		t.Errorf("the stub's stderr wrote %q to shim's file", b)
	}
}

// A socket closed without a launch (the start was given up: a failed
// fence, a discarded early stub) is an error, and the stub mounts nothing.
func TestNoLaunchIsAnError(t *testing.T) {
	c, fd := socketPair(t)
	c.Close()
	if _, _, err := receiveLaunch(fd); err == nil || !strings.Contains(err.Error(), "given up") {
		t.Fatalf("want the start given up, got %v", err)
	}
}

// A launch without its output files is refused: the harness's output
// would go nowhere.
func TestALaunchWithoutOutputFilesIsRefused(t *testing.T) {
	c, fd := socketPair(t)
	go func() {
		c.Write([]byte(`{"plan":{"generation":1,"cwd":"/"},"path":"/bin/true","argv":["true"]}`))
		c.CloseWrite()
	}()
	if _, _, err := receiveLaunch(fd); err == nil || !strings.Contains(err.Error(), "output files") {
		t.Fatalf("want the output files missing, got %v", err)
	}
}

// A launch larger than the stub reads is refused before anything is
// sent; one sent to a stub that is gone is an error.
func TestALaunchTooLargeOrToAGoneStubIsAnError(t *testing.T) {
	c, fd := socketPair(t)
	out := tempFile(t)
	huge := Launch{Plan: &Plan{}, Path: "/bin/true", Argv: []string{"true"}, Env: []string{strings.Repeat("x", maxLaunch)}}
	if err := Send(c, huge, out, out); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("huge: %v", err)
	}
	unix.Close(fd)
	c.Close()
	if err := Send(c, Launch{Plan: &Plan{}, Path: "/bin/true", Argv: []string{"true"}}, out, out); err == nil {
		t.Fatal("sent to a closed socket")
	}
}
