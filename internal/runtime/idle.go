package runtime

import (
	"bytes"
	"os"
	"strconv"
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

// begin starts copying a started harness's output; an idle generation's
// holder gets its own OOM score (holderOOMScore).
func (l *launcher) begin(out *outputs, req api.StartRequest, pid int) {
	out.start()
	if req.Idle {
		holderOOMScore(pid, l.childOOM)
	}
}

// holderOOMScore gives an idle generation's holder an oom_score_adj half
// way between shim's own and its children's (childOOMScore: 0 under a
// shim at -1000, else 1000). With the children's, a call that filled the
// generation's memory through a tmpfs (pages in no process's RSS) made
// the holder, a few MB of RSS, the OOM killer's pick: the call ended its
// own generation. Half way, it goes after every call and still before
// shim (with shim's own it would not: a shim that may not lower its score
// is then the largest process at that score). Writing it needs no
// privilege where shim has none: it is above shim's, the child's floor.
func holderOOMScore(pid int, child []byte) {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	own, err1 := strconv.Atoi(string(bytes.TrimSpace(b)))
	kid, err2 := strconv.Atoi(string(bytes.TrimSpace(child)))
	if err != nil || err1 != nil || err2 != nil || kid <= own {
		return
	}
	_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte(strconv.Itoa((own+kid)/2)), 0)
}
