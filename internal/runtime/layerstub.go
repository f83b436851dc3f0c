package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/errs"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/reaper"
	"golang.org/x/sys/unix"
)

// A layered generation's stub: the process that makes its mount and IPC
// namespaces on its layers and hands them to shim before the harness runs.

// layerStub is a generation's layer stub, started in its cgroup and its
// new mount and IPC namespaces before it is told what to run: the plan
// its layers were laid out with, the process (the harness's, once it
// execs), shim's end of its socket.
type layerStub struct {
	plan  *layers.Plan
	wts   []string
	proc  *reaper.Process
	ready *stubReady
}

// newStub lays out generation n's layers (on worktrees wts), starts its
// stub in group, through in (the generation's network namespace, or
// where shim is), and gives it their plan: it mounts the root layer
// while it waits for its launch.
func (l *launcher) newStub(n uint64, wts []string, group cgroup.Group, in func(func() error) error) (*layerStub, error) {
	plan, err := l.rt.layers.NewPlan(n, wts)
	if err != nil {
		return nil, errs.New(api.CodeStartFailed, "layers of generation %d: %v", n, err)
	}
	r, w, err := readySocket()
	if err != nil {
		return nil, errs.New(api.CodeStartFailed, "layers of generation %d: %v", n, err)
	}
	defer w.Close() // the stub has its copy
	path, args := layers.Command(l.cfg.ShimPath, 3)
	cmd := &exec.Cmd{Path: path, Args: args, Env: []string{}, Dir: "/", ExtraFiles: []*os.File{w},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true, Cloneflags: layers.Cloneflags}}
	var proc *reaper.Process
	if err := in(func() (err error) { proc, err = l.spawn(cmd, group); return err }); err != nil {
		r.Close()
		return nil, errs.New(api.CodeStartFailed, "layer stub of generation %d: %v", n, err)
	}
	// Its root layer is mounted from here on, beside whatever the start
	// still waits for (the fence's restore); a stub that cannot says why
	// at its launch.
	r.SetWriteDeadline(time.Now().Add(layerStubTimeout))
	err = layers.Prepare(r, plan)
	r.SetWriteDeadline(time.Time{})
	if err != nil {
		r.Close() // the stub, if alive, ends at the EOF; the caller removes its cgroup
		return nil, errs.New(api.CodeStartFailed, "layer stub of generation %d: %v", n, err)
	}
	return &layerStub{plan: plan, wts: wts, proc: proc, ready: &stubReady{r: r}}, nil
}

// launch tells the stub what to run (cmd, as the harness with cmd's
// credentials, in cwd) and waits until it has mounted the layers and
// execs it; it returns the namespace the stub holds them in.
func (s *layerStub) launch(ctx context.Context, cmd *exec.Cmd) (*heldMounts, error) {
	p := *s.plan
	p.Cwd = cmd.Dir
	if c := cmd.SysProcAttr.Credential; c != nil {
		p.SetCred, p.UID, p.GID, p.Groups = true, c.Uid, c.Gid, c.Groups
	}
	stdout, _ := cmd.Stdout.(*os.File)
	stderr, _ := cmd.Stderr.(*os.File)
	if stdout == nil || stderr == nil {
		s.ready.r.Close()
		return nil, errors.New("the harness's output is not a file")
	}
	*s.plan = p
	deadline := stubDeadline(ctx)
	s.ready.r.SetWriteDeadline(deadline)
	if err := layers.Send(s.ready.r, layers.Launch{Plan: &p, Path: cmd.Path, Argv: cmd.Args, Env: cmd.Env}, stdout, stderr); err != nil {
		// A stub that failed before its launch (its mounts made
		// private) said why on the socket.
		if _, why := s.ready.wait(deadline); why != nil {
			return nil, why
		}
		return nil, err
	}
	return s.ready.wait(deadline)
}

// exited reports whether the stub is gone already (killed while it
// waited: the OOM killer, a person): a start cannot take it over.
func (s *layerStub) exited() bool {
	select {
	case <-s.proc.Done():
		return true
	default:
		return false
	}
}

// sealOnce seals the packs of a layered worktree's lower before its first
// layered generation in this shim (a clone's packs are its owner's); after
// that every fence seals what its gits added (maintainAfterFence).
func (rt *Runtime) sealOnce(path string, wt worktree) {
	rt.mu.Lock()
	done := rt.sealed[path]
	rt.sealed[path] = true
	rt.mu.Unlock()
	if !done {
		rt.sealPacks(path, wt)
	}
}

// sealPacks seals a layered worktree's packs (worktree.SealPacks); a
// failure costs only copies of packs in the next layers, and is logged.
func (rt *Runtime) sealPacks(path string, wt worktree) {
	if err := wt.SealPacks(); err != nil {
		rt.log.Warn("packs of a layered worktree not sealed; a harness's git may copy them into its layer", "worktree", path, "error", err)
	}
}

// stubReady is the layer stub's report (layers.Plan.Ready): "M" and its
// mount namespace once the layers are mounted and it execs the harness
// (the socket does not survive the exec), the reason when it could not
// mount them.
type stubReady struct {
	r *net.UnixConn
}

// readySocket is the report's socket pair: shim's end, the stub's.
func readySocket() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "ready")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	return c.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "ready-stub"), nil
}

// layerStubTimeout bounds the mounts of one start.
const layerStubTimeout = 30 * time.Second

// stubDeadline is when a start gives up on its stub: layerStubTimeout
// from now, or ctx's deadline if sooner.
func stubDeadline(ctx context.Context) time.Time {
	deadline := time.Now().Add(layerStubTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return deadline
}

// wait reads the report until the stub's exec closes its end (or
// deadline), and returns the namespace it sent (nil when it sent none).
func (s *stubReady) wait(deadline time.Time) (*heldMounts, error) {
	defer s.r.Close()
	s.r.SetReadDeadline(deadline)
	var text []byte
	var ns *heldMounts
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(2*4))
	for len(text) < 4096 {
		n, oobn, _, _, err := s.r.ReadMsgUnix(buf, oob)
		got := buf[:n]
		if fds := unixRights(oob[:oobn]); len(fds) > 0 {
			for _, fd := range fds[min(len(fds), 2):] {
				unix.Close(fd)
			}
			if ns == nil && n > 0 && buf[0] == 'M' {
				ns = &heldMounts{f: os.NewFile(uintptr(fds[0]), "mntns")}
				if len(fds) > 1 {
					ns.ipc = os.NewFile(uintptr(fds[1]), "ipcns")
				}
				got = got[1:] // the marker is not part of a reason
			} else {
				for _, fd := range fds[:min(len(fds), 2)] {
					unix.Close(fd)
				}
			}
		}
		text = append(text, got...)
		if errors.Is(err, io.EOF) || (err == nil && n == 0 && oobn == 0) {
			break
		}
		if err != nil {
			ns.release()
			return nil, fmt.Errorf("the layer stub did not report: %v", err)
		}
	}
	if t := strings.TrimSpace(string(text)); t != "" {
		ns.release()
		return nil, fmt.Errorf("%s", t)
	}
	return ns, nil
}

// unixRights are the fds of a control message (none when it has none).
func unixRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if r, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}
