package runtime

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/internal/layers"
)

// fakeStubEnd plays the layer stub on its end of the ready socket: it
// reads the launch to its end (closing the files that came with it),
// then answers with answer and the fds, and closes.
func fakeStubEnd(t *testing.T, stub *os.File, answer string, fds ...int) <-chan []byte {
	t.Helper()
	got := make(chan []byte, 1)
	go func() {
		defer stub.Close()
		var launch []byte
		buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(4*4))
		for {
			n, oobn, _, _, err := unix.Recvmsg(int(stub.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
			for _, fd := range unixRights(oob[:oobn]) {
				unix.Close(fd)
			}
			if err != nil || n == 0 && oobn == 0 {
				break
			}
			launch = append(launch, buf[:n]...)
		}
		got <- launch
		if answer != "" || len(fds) > 0 {
			unix.Sendmsg(int(stub.Fd()), []byte(answer), unix.UnixRights(fds...), nil, 0)
		}
	}()
	return got
}

func openFD(t *testing.T) int {
	t.Helper()
	fd, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func outFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// A layered start trusts only the stub's report: "M" with its
// namespaces is mounted; any text is the reason it could not mount (the
// namespaces it sent are let go); no report by the deadline is an error.
func TestALayeredStartTrustsOnlyTheStubsReport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   string
		fds      int
		err      string // "" none
		ns, ipc  bool
		deadline time.Duration
	}{
		{name: "mounted, with its IPC namespace", answer: "M", fds: 2, ns: true, ipc: true},
		{name: "mounted, mount namespace only", answer: "M", fds: 1, ns: true},
		{name: "no namespace to hold (the stub could not open it)"},
		{name: "the reason it could not mount", answer: "layers of generation 4: root layer: EPERM", err: "root layer: EPERM"},
		{name: "mounted, then a reason: not mounted", answer: "Mbut then: ENOSPC", fds: 2, err: "but then: ENOSPC"},
		{name: "namespaces without the marker are not taken", answer: "x", fds: 2, err: "x"},
		{name: "no report by the deadline", deadline: -time.Second, err: "did not report"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, w, err := readySocket()
			if err != nil {
				t.Fatal(err)
			}
			var fds []int
			for range tc.fds {
				fds = append(fds, openFD(t))
			}
			if tc.deadline >= 0 {
				fakeStubEnd(t, w, tc.answer, fds...)
			} else {
				defer w.Close()
			}
			for _, fd := range fds {
				defer unix.Close(fd)
			}
			stub := &layerStub{plan: &layers.Plan{Generation: 4}, ready: &stubReady{r: r}}
			out := outFile(t)
			cmd := &exec.Cmd{Path: "/bin/agent", Args: []string{"agent"}, Dir: "/w", Stdout: out, Stderr: out,
				SysProcAttr: &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{5}}}}
			ctx := context.Background()
			if tc.deadline < 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, time.Now().Add(tc.deadline))
				defer cancel()
			}
			h, err := stub.launch(ctx, cmd)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || h != nil {
					t.Fatalf("got %v %v, want error %q", h, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (h != nil) != tc.ns || h != nil && (h.ipc != nil) != tc.ipc {
				t.Fatalf("held %+v", h)
			}
			h.release()
			if p := stub.plan; p.Cwd != "/w" || !p.SetCred || p.UID != 1000 || p.GID != 1000 || len(p.Groups) != 1 {
				t.Errorf("the plan does not carry the harness's cwd and credentials: %+v", p)
			}
		})
	}
}

// A harness whose output is not a file cannot be handed to a stub: the
// start fails and the stub's socket is closed (it ends).
func TestAStubIsGivenOnlyFilesForOutput(t *testing.T) {
	r, w, err := readySocket()
	if err != nil {
		t.Fatal(err)
	}
	got := fakeStubEnd(t, w, "")
	stub := &layerStub{plan: &layers.Plan{}, ready: &stubReady{r: r}}
	cmd := &exec.Cmd{Path: "/bin/agent", Args: []string{"agent"}, Stdout: &strings.Builder{}, Stderr: outFile(t), SysProcAttr: &syscall.SysProcAttr{}}
	if _, err := stub.launch(context.Background(), cmd); err == nil {
		t.Fatal("launched with an output that is not a file")
	}
	if launch := <-got; len(launch) != 0 {
		t.Fatalf("the stub was sent %q", launch)
	}
}

// A stub that ended before its launch (it could not make its mounts
// private) said why: that is the start's error.
func TestAStubThatEndedBeforeItsLaunchGivesItsReason(t *testing.T) {
	r, w, err := readySocket()
	if err != nil {
		t.Fatal(err)
	}
	unix.Write(int(w.Fd()), []byte("make mounts private: EPERM"))
	w.Close()
	stub := &layerStub{plan: &layers.Plan{}, ready: &stubReady{r: r}}
	out := outFile(t)
	cmd := &exec.Cmd{Path: "/bin/agent", Args: []string{"agent"}, Stdout: out, Stderr: out, SysProcAttr: &syscall.SysProcAttr{}}
	if _, err := stub.launch(context.Background(), cmd); err == nil || err.Error() != "make mounts private: EPERM" {
		t.Fatalf("got %v, want the stub's reason", err)
	}
}
