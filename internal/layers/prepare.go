package layers

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"reflect"

	"golang.org/x/sys/unix"
)

// A stub started before its generation may run (Command) mounts its root
// layer as soon as shim gives it the plan (Prepare), beside the fence of
// the generation before: the sandbox's mounts bound back in are the
// start's largest part after the exec. The worktree layers wait for the
// Launch: their lowers are the checkouts the fence restores until then.

// Prepare gives the stub at the other end of c the plan of its layers (a
// frame: its length, then the plan as JSON). The Launch that follows
// must carry a plan that mounts the same layers.
func Prepare(c *net.UnixConn, p *Plan) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if len(b) > maxLaunch {
		return fmt.Errorf("the layers' plan takes %d bytes, more than %d", len(b), maxLaunch)
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	if _, err := c.Write(append(frame, b...)); err != nil {
		return fmt.Errorf("send the layer stub its plan: %w", err)
	}
	return nil
}

// prepare receives the plan Prepare sent on socket fd and mounts its
// root layer (every worktree's path left out: mountLaunched binds its
// overlay in).
func prepare(fd int) (*Plan, error) {
	var head [4]byte
	if err := readFull(fd, head[:]); err != nil {
		return nil, fmt.Errorf("no plan: the start was given up (%v)", err)
	}
	n := binary.BigEndian.Uint32(head[:])
	if n == 0 || n > maxLaunch {
		return nil, fmt.Errorf("plan: a frame of %d bytes is not one", n)
	}
	b := make([]byte, n)
	if err := readFull(fd, b); err != nil {
		return nil, fmt.Errorf("plan: %v", err)
	}
	var p Plan
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("plan: %q is not one (%v)", truncate(b, 80), err)
	}
	if p.Root == nil {
		return &p, nil
	}
	if err := p.mountRoot(p.worktreePaths()); err != nil {
		return nil, fmt.Errorf("layers of generation %d: %v", p.Generation, err)
	}
	return &p, nil
}

// mountLaunched finishes the view of a prepared stub: the worktree
// overlays in place, each bound into the merged root, the paths shim
// needs inside, the pivot.
func (p *Plan) mountLaunched() error {
	if err := p.mountWorktrees(); err != nil {
		return err
	}
	if p.Root == nil {
		return nil
	}
	return p.bindAndPivot(p.worktreePaths())
}

func (p *Plan) worktreePaths() []string {
	out := make([]string, 0, len(p.Worktrees))
	for _, w := range p.Worktrees {
		out = append(out, w.Path)
	}
	return out
}

// sameMounts reports whether the Launch's plan mounts what the prepared
// one did (the harness's credentials and cwd are the Launch's own).
func sameMounts(a, b *Plan) bool {
	return a.Generation == b.Generation && reflect.DeepEqual(a.Root, b.Root) && reflect.DeepEqual(a.Worktrees, b.Worktrees) &&
		reflect.DeepEqual(a.Bind, b.Bind) && reflect.DeepEqual(a.Hide, b.Hide) && a.RootTmpfs == b.RootTmpfs
}

// readFull reads len(b) bytes from fd, and nothing past them (what
// follows is the Launch, whose files ride on its first byte).
func readFull(fd int, b []byte) error {
	for got := 0; got < len(b); {
		n, err := unix.Read(fd, b[got:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("closed")
		}
		got += n
	}
	return nil
}
