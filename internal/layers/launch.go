package layers

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Launch is what a layer stub started ahead of its generation waits for
// (Command): the plan, then the harness's command and environment. Its
// stdout and stderr travel beside it as file descriptors. It holds no
// secret: a harness's credentials go through the broker.
type Launch struct {
	Plan *Plan    `json:"plan"`
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
}

// maxLaunch bounds a Launch on the wire (an environment near ARG_MAX).
const maxLaunch = 4 << 20

// Command is the layer stub that waits on its socket, file descriptor fd
// in the stub, for its Launch: shimPath re-executed with StubArg, run in
// new mount and IPC namespaces (Cloneflags, which the caller adds to its
// SysProcAttr) as root. It mounts its root layer once Prepare has given
// it its plan, and its worktree layers only once Send has given it its
// Launch, so the stub can be started (its exec and Go's start-up, several
// milliseconds, more in a container) and its root layer mounted while the
// generation before it is still being fenced.
func Command(shimPath string, fd int) (string, []string) {
	return shimPath, []string{"shim", StubArg, "fd:" + strconv.Itoa(fd)}
}

// Send gives the stub at the other end of c its Launch and the harness's
// stdout and stderr, and closes c's writing half: the stub reads until
// then. The stub's report comes back on c (see Plan.Ready).
func Send(c *net.UnixConn, m Launch, stdout, stderr *os.File) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > maxLaunch {
		return fmt.Errorf("the harness's command and environment take %d bytes, more than %d", len(b), maxLaunch)
	}
	rights := unix.UnixRights(int(stdout.Fd()), int(stderr.Fd()))
	n, _, err := c.WriteMsgUnix(b, rights, nil)
	for err == nil && n < len(b) {
		var k int
		k, err = c.Write(b[n:])
		n += k
	}
	if err != nil {
		return fmt.Errorf("send the layer stub its launch: %w", err)
	}
	return c.CloseWrite()
}

// receiveLaunch reads a Launch from socket fd until shim closes its
// writing half, and the two files that came with it.
func receiveLaunch(fd int) (*Launch, []int, error) {
	var data []byte
	var files []int
	buf, oob := make([]byte, 64<<10), make([]byte, unix.CmsgSpace(2*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("wait for the launch: %w", err)
		}
		if oobn > 0 {
			msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				if fds, err := unix.ParseUnixRights(&m); err == nil {
					files = append(files, fds...)
				}
			}
		}
		if n == 0 && oobn == 0 {
			break
		}
		data = append(data, buf[:n]...)
		if len(data) > maxLaunch {
			return nil, nil, errors.New("launch too long")
		}
	}
	if len(data) == 0 {
		return nil, nil, errors.New("no launch: the start was given up")
	}
	var m Launch
	if err := json.Unmarshal(data, &m); err != nil || m.Plan == nil || m.Path == "" || len(m.Argv) == 0 {
		return nil, nil, fmt.Errorf("launch: %q is not one (%v)", truncate(data, 80), err)
	}
	if len(files) != 2 {
		return nil, nil, fmt.Errorf("launch: %d output files, want stdout and stderr", len(files))
	}
	return &m, files, nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
