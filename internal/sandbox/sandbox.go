// Package sandbox starts a shim init the way a sandbox would: as PID 1 of
// fresh pid and mount namespaces (and, on request, a network namespace),
// with its own runtime dir and cgroup subtree under the cgroup2 mount. It is
// the one launcher of `shim demo`, `shim bench` and the integration tests;
// Close removes everything it made. Nothing here signals a process it did
// not start.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/shimdev/shim/client"
)

// Options configure Start.
type Options struct {
	Bin        string        // the shim binary
	Name       string        // names the temporary runtime dir and cgroup root
	RuntimeDir string        // "" : a fresh temporary dir, removed by Close
	CgroupRoot string        // "" : a fresh dir under the cgroup2 mount, removed by Close
	Args       []string      // extra flags of shim init
	Service    []string      // shim init -- SERVICE...
	NewNet     bool          // its own network namespace too
	Out        io.Writer     // shim's stdout and stderr
	Stdout     io.Writer     // shim's stdout, when it is not Out
	Ready      time.Duration // how long the control socket may take to answer; 0 is 10s
}

// Sandbox is one running shim init.
type Sandbox struct {
	Cmd        *exec.Cmd
	RuntimeDir string
	CgroupRoot string
	Client     *client.Client
	done       chan struct{}
	exitCode   int
	ownDir     bool
	ownRoot    bool
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

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// Start starts shim init and waits until its control socket answers.
func Start(o Options) (*Sandbox, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("run as root: shim needs to create namespaces and cgroups")
	}
	s := &Sandbox{RuntimeDir: o.RuntimeDir, CgroupRoot: o.CgroupRoot, done: make(chan struct{})}
	if s.RuntimeDir == "" {
		d, err := os.MkdirTemp("", "shim-"+o.Name+"-")
		if err != nil {
			return nil, err
		}
		s.RuntimeDir, s.ownDir = d, true
	}
	if s.CgroupRoot == "" {
		mnt := Cgroup2Mount()
		if mnt == "" {
			s.Close()
			return nil, errors.New("no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified")
		}
		b := make([]byte, 4)
		rand.Read(b)
		s.CgroupRoot, s.ownRoot = filepath.Join(mnt, "shim-"+o.Name+"-"+hex.EncodeToString(b)), true
	}
	args := []string{"init", "--runtime-dir", s.RuntimeDir, "--cgroup-root", s.CgroupRoot, "--mount-proc"}
	if !hasFlag(o.Args, "--layers") {
		// its own layers dir, so that sandboxes side by side never share one
		args = append(args, "--layers", filepath.Join(s.RuntimeDir, "layers"))
	}
	args = append(args, o.Args...)
	if len(o.Service) > 0 {
		args = append(append(args, "--"), o.Service...)
	}
	s.Cmd = exec.Command(o.Bin, args...)
	flags := uintptr(syscall.CLONE_NEWPID | syscall.CLONE_NEWNS)
	if o.NewNet {
		flags |= syscall.CLONE_NEWNET
	}
	s.Cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	s.Cmd.Stdout, s.Cmd.Stderr = o.Out, o.Out
	if o.Stdout != nil {
		s.Cmd.Stdout = o.Stdout
	}
	s.Cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if err := s.Cmd.Start(); err != nil {
		s.Close()
		return nil, fmt.Errorf("start shim: %w", err)
	}
	go func() {
		//shimlint:allow onereaper: sandbox starts shim itself for the demo and tests; it never runs inside PID 1
		err := s.Cmd.Wait()
		s.exitCode = s.Cmd.ProcessState.ExitCode()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				s.exitCode = 128 + int(ws.Signal())
			}
		}
		close(s.done)
	}()
	s.Client = client.New(s.RuntimeDir)
	if err := s.waitReady(o.Ready); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Sandbox) waitReady(d time.Duration) error {
	if d == 0 {
		d = 10 * time.Second
	}
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := s.Client.Health(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("shim exited at start with code %d", s.exitCode)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("shim not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // polling a socket that is not there yet
	}
}

// Done is closed when shim has exited.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// ExitCode is shim's exit code (128+signal when killed); valid after Done.
func (s *Sandbox) ExitCode() int { return s.exitCode }

// Wait waits up to timeout for shim to exit.
func (s *Sandbox) Wait(timeout time.Duration) (int, bool) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-s.done:
		return s.exitCode, true
	case <-t.C:
		return 0, false
	}
}

// Stop sends SIGTERM and waits up to grace, then kills shim (as PID 1 its
// death kills its whole pid namespace). grace 0 kills at once.
func (s *Sandbox) Stop(grace time.Duration) {
	if s.Cmd == nil || s.Cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	if grace > 0 {
		s.Cmd.Process.Signal(syscall.SIGTERM)
		if _, ok := s.Wait(grace); ok {
			return
		}
	}
	s.Cmd.Process.Kill()
	<-s.done
}

// Close stops shim (at once) and removes the runtime dir and cgroup subtree
// Start made.
func (s *Sandbox) Close() {
	s.Stop(0)
	if s.ownRoot {
		RemoveCgroupTree(s.CgroupRoot)
	}
	if s.ownDir {
		os.RemoveAll(s.RuntimeDir)
	}
}

// RemoveCgroupTree kills whatever is left in a cgroup2 subtree the caller
// created (cgroup.kill) and removes it, leaves first.
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
