package runtime

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitguard"
)

// ReachArg is the hidden first argument of the reach probe (RunReach):
// `shim __reach PID` tries every way into PID.
const ReachArg = "__reach"

// probeUID is the unprivileged uid of the start-up probes' processes
// (nobody): no harness is meant to run as it, and none runs yet.
const probeUID = 65534

// probeTimeout bounds each probe process.
const probeTimeout = 10 * time.Second

// ownerProbe is gitguard.OwnerProbe on the real kernel, every process
// through the one reaper.
type ownerProbe struct {
	l   *launcher
	git string
}

func probeCred() *syscall.Credential {
	return &syscall.Credential{Uid: probeUID, Gid: probeUID, Groups: []uint32{}}
}

func probeEnv() []string {
	return []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
}

func (p ownerProbe) run(cmd *exec.Cmd) error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	return p.l.cfg.Reaper.Run(ctx, cmd, nil)
}

// Start runs `git --version` as probeUID with ambient.
func (p ownerProbe) Start(ambient []uintptr) error {
	cmd := exec.Command(p.git, "--version")
	cmd.Dir, cmd.Env = "/", probeEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: probeCred(), AmbientCaps: ambient}
	return p.run(cmd)
}

// Reach starts a git that waits on its stdin (hash-object --stdin) as
// probeUID, then the reach probe as the same uid beside it.
func (p ownerProbe) Reach() ([]string, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	target := exec.Command(p.git, "hash-object", "--stdin")
	target.Dir, target.Env, target.Stdin = "/", probeEnv(), pr
	target.SysProcAttr = &syscall.SysProcAttr{Credential: probeCred()}
	proc, err := p.l.cfg.Reaper.Start(target)
	pr.Close()
	if err != nil {
		pw.Close()
		return nil, fmt.Errorf("start git: %w", err)
	}
	defer func() {
		pw.Close() // git reads EOF and exits
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		if _, err := proc.Wait(ctx); err != nil {
			_ = unix.Kill(proc.Pid, unix.SIGKILL) // ours, not yet reaped
			proc.Wait(context.Background())
		}
	}()
	var out, errb bytes.Buffer
	reach := exec.Command(p.l.cfg.ShimPath, ReachArg, strconv.Itoa(proc.Pid))
	reach.Dir, reach.Env, reach.Stdout, reach.Stderr = "/", probeEnv(), &out, &errb
	reach.SysProcAttr = &syscall.SysProcAttr{Credential: probeCred()}
	if err := p.run(reach); err != nil {
		return nil, fmt.Errorf("reach probe: %v: %s", err, strings.TrimSpace(errb.String()))
	}
	select {
	case <-proc.Done():
		// Its pid may be another's now: what the probe found is not git's.
		return nil, errors.New("reach probe: the probe's git exited before the probe ended")
	default:
	}
	line, ok := strings.CutPrefix(strings.TrimSpace(out.String()), "open:")
	if !ok {
		return nil, fmt.Errorf("reach probe said %q", out.String())
	}
	return strings.Fields(line), nil
}

// RunReach is the reach probe's main (ReachArg). With a pid it prints
// "open:" and the ways into that process that were not refused; any
// answer but a refusal (EACCES, EPERM) for one of them is an error (exit
// 1), so that a vanished target never reads as out of reach.
func RunReach(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: shim __reach PID")
		return 2
	}
	pid, err := strconv.Atoi(args[0])
	if err != nil || pid <= 1 {
		fmt.Fprintln(os.Stderr, "bad pid")
		return 2
	}
	proc := "/proc/" + args[0] + "/"
	tries := []struct {
		name string
		try  func() error
	}{
		{"ptrace", func() error {
			goruntime.LockOSThread() // the tracer is this thread; it exits with the process
			return unix.PtraceSeize(pid)
		}},
		{"mem", func() error { return openClose(proc + "mem") }},
		{"root", func() error { _, err := os.Readlink(proc + "root"); return err }},
		{"cwd", func() error { _, err := os.Readlink(proc + "cwd"); return err }},
		{"fd", func() error { _, err := os.Readlink(proc + "fd/0"); return err }},
		{"environ", func() error { return openClose(proc + "environ") }},
	}
	var open []string
	for _, t := range tries {
		switch err := t.try(); {
		case err == nil:
			open = append(open, t.name)
		case errorsIsDenied(err):
		default:
			fmt.Fprintf(os.Stderr, "%s: %v\n", t.name, err)
			return 1
		}
	}
	fmt.Println("open:", strings.Join(open, " "))
	return 0
}

func openClose(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func errorsIsDenied(err error) bool {
	var errno syscall.Errno
	if pe, ok := err.(*os.PathError); ok {
		err = pe.Err
	}
	if e, ok := err.(syscall.Errno); ok {
		errno = e
	}
	return errno == unix.EACCES || errno == unix.EPERM
}

// peerCredReliable reports whether SO_PEERCRED names a peer of another
// uid as that peer, not as shim itself: a thread of shim's whose
// effective ids are probeUID's (gitguard.AsEffectiveIDs; no process to
// start, so nothing a sandbox's file modes could refuse) connects to an
// abstract socket of shim's. The kernel credits the connection to the
// connecting thread's effective uid; under gVisor (runsc 20221219)
// SO_PEERCRED reports the listener's own credentials for every peer.
// Another process that connects first reads as its own uid where
// SO_PEERCRED works, and as shim's where it does not.
func peerCredReliable() (bool, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return false, err
	}
	name := fmt.Sprintf("@shim-peercred-%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return false, err
	}
	defer ln.Close()
	fd := -1
	err = gitguard.AsEffectiveIDs(probeUID, probeUID, func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		// A unix connect waits on a full backlog for the send timeout:
		// bounded, so the start-up probe cannot hang every start.
		tv := unix.NsecToTimeval(probeTimeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			return err
		}
		return unix.Connect(fd, &unix.SockaddrUnix{Name: name})
	})
	if fd >= 0 {
		defer unix.Close(fd)
	}
	if err != nil {
		return false, fmt.Errorf("connect as uid %d: %w", probeUID, err)
	}
	ln.SetDeadline(time.Now().Add(probeTimeout))
	c, err := ln.AcceptUnix()
	if err != nil {
		return false, err
	}
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return false, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return false, err
	}
	if cerr != nil {
		return false, cerr
	}
	return cred.Uid != uint32(os.Geteuid()), nil
}

// probeOwnerGuard decides how shim's gits of a worktree's owner are kept
// out of a harness's reach (gitguard.DecideOwnerGuard), installs it, and
// checks SO_PEERCRED; what is weaker than the default goes to status.
// Without git there is no owner's git to guard and nothing is probed.
func (l *launcher) probeOwnerGuard() []api.Weakness {
	var weak []api.Weakness
	if git, err := gitguard.GitPath(); err == nil {
		g := gitguard.DecideOwnerGuard(gitguard.CapsHeld(), ownerProbe{l: l, git: git})
		gitguard.SetOwnerGuard(g)
		switch g.Mode {
		case gitguard.GuardPtraceScope:
			weak = append(weak, api.Weakness{Code: api.WeakOwnerGitPtraceScope, Message: g.Reason})
		case gitguard.GuardNone:
			weak = append(weak, api.Weakness{Code: api.WeakOwnerGitUnprotected, Message: g.Reason})
		}
		if g.Reason != "" {
			l.rt.log.Warn("how shim's gits of a worktree's owner are kept out of its reach", "guard", g.Mode, "reason", g.Reason)
		}
	}
	ok, err := peerCredReliable()
	if err != nil {
		weak = append(weak, api.Weakness{Code: api.WeakPeerCredUnreliable, Message: "SO_PEERCRED could not be checked (" + err.Error() + "); the control socket's file mode (0600) is its only check known to hold"})
	} else if !ok {
		weak = append(weak, api.Weakness{Code: api.WeakPeerCredUnreliable, Message: "SO_PEERCRED reports shim's own credentials for a peer of another uid (gVisor does): the control socket's peer check sees every peer as shim, and only its file mode (0600) keeps other uids out; a process with CAP_DAC_OVERRIDE (root, or any uid a runtime's exec gives capabilities) passes it"})
	}
	for _, w := range weak {
		l.rt.log.Warn("weaker than the default here", "code", w.Code, "message", w.Message)
	}
	return weak
}
