package runtime

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/internal/cgroup"
	"github.com/shimdev/shim/internal/reaper"
)

var errNoNamespace = errors.New("the generation's mount namespace is not held (its layer stub sent none)")

// spawnCall starts cmd as a tool call of generation g, in group (its
// gen-N/proc-K), through the one reaper. The fork happens on an OS thread
// of its own that first left the process's shared filesystem context
// (unshare CLONE_FS) and entered g's mount, IPC and network namespaces:
// the child inherits that thread's namespaces, root and cwd, so it sees
// g's layers and g's network exactly as its harness does. The thread also
// sets no_new_privs, which the child inherits. It is never handed back to
// the Go scheduler: its goroutine exits locked, and the runtime ends the
// thread with it (nor does the runtime create threads from a locked one).
//
// The child enters group with no window outside it: CLONE_INTO_CGROUP,
// with an fd of group opened here, in shim's mount namespace; where clone3
// is refused, through the placement stub (this binary, /proc/self/exe in
// the child, which resolves whatever root it has), moved into group before
// it is released. It returns the child and a pidfd of it (-1 when the
// stub placed it).
func (l *launcher) spawnCall(g *generation, group cgroup.Group, c *callCmd) (*reaper.Process, int, error) {
	l.prepare()
	inheritedOnce.Do(closeOnExecInherited)
	var mntns, ipcns *os.File
	if g.layers != nil {
		if g.mounts == nil || g.mounts.f == nil {
			return nil, -1, errNoNamespace
		}
		mntns, ipcns = g.mounts.f, g.mounts.ipc
	}
	netns, err := netnsOf(g)
	if err != nil {
		return nil, -1, err
	}
	if netns != nil {
		defer netns.Close()
	}
	attr := &syscall.SysProcAttr{Setsid: true, Credential: c.cred}
	if c.tty {
		attr.Setctty, attr.Ctty = true, 0
	}
	cmd := &exec.Cmd{Args: c.argv, Env: c.env, Dir: c.dir, Stdin: c.stdin, Stdout: c.stdout, Stderr: c.stderr, SysProcAttr: attr}
	var release *os.File
	pidfd := -1
	if l.cloneIntoGroup {
		fd, _, err := group.CloneFD()
		if err != nil {
			return nil, -1, err
		}
		defer unix.Close(fd)
		attr.UseCgroupFD, attr.CgroupFD = true, fd
		attr.PidFD = &pidfd
	} else {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, -1, err
		}
		defer r.Close()
		release = w
		cmd.ExtraFiles = []*os.File{r}
	}
	type result struct {
		p   *reaper.Process
		err error
	}
	done := make(chan result, 1)
	go func() {
		goruntime.LockOSThread() // for good: see above
		p, err := l.forkIn(cmd, mntns, ipcns, netns, release != nil)
		done <- result{p, err}
	}()
	res := <-done
	if res.err != nil {
		if release != nil {
			release.Close()
		}
		return nil, -1, res.err
	}
	p := res.p
	if release != nil {
		defer release.Close()
		if err := group.Add(p.Pid); err != nil {
			unix.Kill(p.Pid, unix.SIGKILL)
			return nil, -1, fmt.Errorf("move pid %d into %s: %w", p.Pid, group.Path(), err)
		}
		l.setOOMScore(p.Pid)
		if _, err := release.Write([]byte{1}); err != nil {
			unix.Kill(p.Pid, unix.SIGKILL)
			return nil, -1, err
		}
		return p, -1, nil
	}
	l.setOOMScore(p.Pid)
	return p, pidfd, nil
}

// forkIn runs on the locked thread: it enters the namespaces, finds the
// command on the call's PATH inside them, and starts it.
func (l *launcher) forkIn(cmd *exec.Cmd, mntns, ipcns, netns *os.File, stub bool) (*reaper.Process, error) {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return nil, fmt.Errorf("unshare the filesystem context: %w", err)
	}
	for _, ns := range []struct {
		f    *os.File
		kind int
		name string
	}{{mntns, unix.CLONE_NEWNS, "mount"}, {ipcns, unix.CLONE_NEWIPC, "IPC"}, {netns, unix.CLONE_NEWNET, "network"}} {
		if ns.f == nil {
			continue
		}
		if err := unix.Setns(int(ns.f.Fd()), ns.kind); err != nil {
			return nil, fmt.Errorf("enter the generation's %s namespace: %w", ns.name, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("no_new_privs: %w", err)
	}
	path, err := lookPath(cmd.Args[0], cmd.Env)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(path); err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("%s is not an executable file", path)
	}
	cmd.Path = path
	if stub {
		// The placement stub waits on fd 3 (its only extra file).
		cmd.Args = append([]string{"shim", StubArg, strconv.Itoa(3), path}, cmd.Args...)
		cmd.Path = "/proc/self/exe"
	}
	return l.cfg.Reaper.Start(cmd)
}

// inheritedOnce marks shim's inherited files close-on-exec once, before
// the first tool call.
var inheritedOnce sync.Once

// closeOnExecInherited marks close-on-exec every file shim holds without
// the flag: only what it inherited from its own parent (every file Go
// opens has it). A tool call gets stdin, stdout and stderr only, as a
// layered harness does (its stub closes the rest itself); the fork of a
// call cannot run code of shim's between fork and exec to close them.
func closeOnExecInherited() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && fl&unix.FD_CLOEXEC == 0 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, fl|unix.FD_CLOEXEC)
		}
	}
}

// netnsOf opens g's network namespace for one call's fork (nil: the
// generation shares shim's), from a thread inside it. Opened a call at a
// time, never kept: a namespace fd held past the generation would keep
// its namespace alive.
func netnsOf(g *generation) (*os.File, error) {
	if g.net == nil {
		return nil, nil
	}
	var f *os.File
	err := g.net.Run(func() (err error) {
		f, err = os.Open("/proc/thread-self/ns/net")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("the generation's network namespace: %w", err)
	}
	return f, nil
}
