package runtime

import (
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// HoldArg is the hidden argument of an idle generation's holder: the
// process that stands for the harness of a generation started without one
// (StartRequest.Idle). It runs as the harness would (in the generation's
// cgroup, namespaces and layers, as its user) and does nothing: it keeps
// the generation's mount namespace populated and gives wait, signal and
// the fence the process they expect. Tool calls run beside it.
const HoldArg = "__hold"

// holderPath is the holder's executable: this binary through the
// child's own /proc/self/exe, which resolves whatever root the child
// has (a generation's root layer need not show shim's path).
const holderPath = "/proc/self/exe"

// harnessCommand is the path and argv a generation's start runs: the
// announced command on the harness's PATH, or the holder of an idle one.
func harnessCommand(req api.StartRequest, env []string) (string, []string, error) {
	if req.Idle {
		return holderPath, []string{"shim-hold", HoldArg}, nil
	}
	path, err := lookPath(req.Command[0], env)
	if err != nil {
		return "", nil, errs.New(api.CodeStartFailed, "%v", err)
	}
	return path, req.Command, nil
}

// holderCred is the credential the harness runs with: the announced
// user's, except that an idle generation's holder stays root (it only
// waits, with nothing to exec), so that no tool call, which runs as the
// generation's user, can kill it and so end its own generation.
func holderCred(req api.StartRequest, cred *syscall.Credential) *syscall.Credential {
	if req.Idle {
		return nil
	}
	return cred
}

// RunHold is the holder's main: it waits for signals until one ends it.
// It never exits on its own.
func RunHold() int {
	for {
		unix.Pause()
	}
}
