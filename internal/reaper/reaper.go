// Package reaper is the one place in shim that calls wait4.
//
// As PID 1 (or a child subreaper) shim inherits every orphan in the sandbox
// and must reap them, but a blanket wait4(-1) loop steals the exit status of
// any child that some other code path is waiting for: the classic Go pitfall
// where exec.Cmd.Wait fails with ECHILD because the reaper got there first.
// So shim never calls exec.Cmd.Wait. Every child is started through Start or
// Run, which register the pid before the reaper can see it exit, and the
// reaper hands each tracked status to its Process; everything else is an
// orphan and is simply collected.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Exit is how a process ended.
type Exit struct {
	Pid    int       `json:"pid"`
	Code   int       `json:"exit_code"`        // exit status, or 128+signal when killed by a signal
	Signal int       `json:"signal,omitempty"` // the signal that killed it, 0 when it exited
	At     time.Time `json:"exited_at"`
}

// Process is a child started through the reaper.
type Process struct {
	Pid  int
	done chan struct{}
	exit Exit
}

// Done is closed when the process has been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exit returns how the process ended; valid once Done is closed.
func (p *Process) Exit() Exit { <-p.done; return p.exit }

// Wait blocks until the process is reaped or ctx ends.
func (p *Process) Wait(ctx context.Context) (Exit, error) {
	select {
	case <-p.done:
		return p.exit, nil
	case <-ctx.Done():
		return Exit{}, ctx.Err()
	}
}

// Reaper owns wait4 for the whole process.
type Reaper struct {
	mu      sync.Mutex // held across fork+register and across each reap pass
	tracked map[int]*Process
	orphans uint64
}

// New returns a reaper; call Loop (or Reap on every SIGCHLD) to collect.
func New() *Reaper { return &Reaper{tracked: map[int]*Process{}} }

// Start starts cmd and tracks it. Holding the lock across the fork means the
// child cannot be reaped as an orphan before its pid is registered.
// cmd.Stdin/Stdout/Stderr should be *os.File or nil: os/exec would copy other
// readers and writers in goroutines that only cmd.Wait collects (use Run).
func (r *Reaper) Start(cmd *exec.Cmd) (*Process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Pid: cmd.Process.Pid, done: make(chan struct{})}
	r.tracked[p.Pid] = p
	return p, nil
}

// Reap collects every exited child without blocking and returns how many it
// collected. Tracked children get their status; orphans are counted.
func (r *Reaper) Reap() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return n
		}
		n++
		p, ok := r.tracked[pid]
		if !ok {
			r.orphans++
			continue
		}
		delete(r.tracked, pid)
		p.exit = exitOf(pid, ws)
		close(p.done)
	}
}

// Orphans is how many untracked children have been reaped so far.
func (r *Reaper) Orphans() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.orphans
}

// Loop reaps on every SIGCHLD until ctx ends. A slow tick backs up the
// signal, which the kernel coalesces and Go delivers on a buffered channel.
func (r *Reaper) Loop(ctx context.Context) {
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, unix.SIGCHLD)
	defer signal.Stop(sigs)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	r.Reap()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
		case <-tick.C:
		}
		r.Reap()
	}
}

func exitOf(pid int, ws unix.WaitStatus) Exit {
	e := Exit{Pid: pid, At: time.Now().UTC()}
	switch {
	case ws.Signaled():
		e.Signal = int(ws.Signal())
		e.Code = 128 + e.Signal
	default:
		e.Code = ws.ExitStatus()
	}
	return e
}

// pipeDrainTimeout bounds how long Run reads a child's output after it
// exited (like exec.Cmd.WaitDelay).
const pipeDrainTimeout = 5 * time.Second

// ExitError is returned by Run when the command exits unsuccessfully.
type ExitError struct{ Exit Exit }

func (e *ExitError) Error() string {
	if e.Exit.Signal != 0 {
		return fmt.Sprintf("killed by signal %d", e.Exit.Signal)
	}
	return fmt.Sprintf("exit status %d", e.Exit.Code)
}

// ExitCode mirrors exec.ExitError.ExitCode.
func (e *ExitError) ExitCode() int { return e.Exit.Code }

// Run starts cmd with start (Start, or a caller's wrapper that places the
// child somewhere first) and waits for it, like exec.Cmd.Run but without
// calling wait4 itself. Readers and writers that are not *os.File are
// connected through pipes copied here. When ctx ends the process is killed.
func (r *Reaper) Run(ctx context.Context, cmd *exec.Cmd, start func(*exec.Cmd) (*Process, error)) error {
	if start == nil {
		start = r.Start
	}
	var ps pipes
	defer ps.closeOurs()
	if err := ps.connect(cmd); err != nil {
		ps.closeTheirs()
		return err
	}
	p, err := start(cmd)
	ps.closeTheirs()
	if err != nil {
		ps.closeOurs()
		ps.copies.Wait()
		return err
	}
	exit, err := p.Wait(ctx)
	if err != nil {
		cmd.Process.Kill()
		exit = p.Exit()
	}
	ps.drain()
	if err != nil {
		return err
	}
	if exit.Code != 0 {
		return &ExitError{Exit: exit}
	}
	return nil
}

// pipes connects a command's readers and writers that are not *os.File
// through pipes copied by goroutines, as exec.Cmd does (without its Wait).
type pipes struct {
	copies sync.WaitGroup
	theirs []*os.File  // the child's ends: closed once it started
	ours   []io.Closer // shim's ends: closed once the output is drained
}

// connect gives cmd a pipe for each of Stdout, Stderr and Stdin that is
// set and not an *os.File.
func (ps *pipes) connect(cmd *exec.Cmd) error {
	for _, w := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
		if *w == nil {
			continue
		}
		if _, ok := (*w).(*os.File); ok {
			continue
		}
		pr, pw, err := os.Pipe()
		if err != nil {
			return err
		}
		ps.theirs, ps.ours = append(ps.theirs, pw), append(ps.ours, pr)
		ps.copies.Add(1)
		go func(dst io.Writer) { defer ps.copies.Done(); io.Copy(dst, pr) }(*w)
		*w = pw
	}
	if cmd.Stdin == nil {
		return nil
	}
	if _, ok := cmd.Stdin.(*os.File); ok {
		return nil
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	ps.theirs, ps.ours = append(ps.theirs, pr), append(ps.ours, pw)
	go func(src io.Reader) { io.Copy(pw, src); pw.Close() }(cmd.Stdin)
	cmd.Stdin = pr
	return nil
}

func (ps *pipes) closeTheirs() {
	for _, f := range ps.theirs {
		f.Close()
	}
	ps.theirs = nil
}

func (ps *pipes) closeOurs() {
	for _, c := range ps.ours {
		c.Close()
	}
}

// drain waits for the output copies after the exit: output may still be
// in flight, but a grandchild that keeps a pipe open must not hold the
// caller forever (pipeDrainTimeout).
func (ps *pipes) drain() {
	copied := make(chan struct{})
	go func() { ps.copies.Wait(); close(copied) }()
	select {
	case <-copied:
	case <-time.After(pipeDrainTimeout):
		ps.closeOurs()
		<-copied
	}
}
