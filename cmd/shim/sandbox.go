package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shimdev/shim/client"
	"github.com/shimdev/shim/internal/sandbox"
)

// localShim is a shim init started by demo and bench through the one
// sandbox launcher: PID 1 of fresh pid and mount namespaces, with a
// temporary runtime dir and its own cgroup subtree; close removes all of it.
type localShim struct {
	sb         *sandbox.Sandbox
	cmd        *exec.Cmd
	runtimeDir string
	cgroupRoot string
	client     *client.Client
}

func startLocalShim(name string, log io.Writer, extra ...string) (*localShim, error) {
	return startShimBin("", name, log, extra...)
}

// startShimBin is startLocalShim of the shim binary bin ("": this one).
func startShimBin(bin, name string, log io.Writer, extra ...string) (*localShim, error) {
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		bin = self
	}
	sb, err := sandbox.Start(sandbox.Options{Bin: bin, Name: name, Args: extra, Out: log})
	if err != nil {
		return nil, err
	}
	return &localShim{sb: sb, cmd: sb.Cmd, runtimeDir: sb.RuntimeDir, cgroupRoot: sb.CgroupRoot, client: sb.Client}, nil
}

// close stops shim (SIGTERM, then SIGKILL) and removes everything it made.
func (ls *localShim) close() {
	ls.sb.Stop(15 * time.Second)
	ls.sb.Close()
}

// cgroup2Mount finds the cgroup2 mount.
func cgroup2Mount() (string, error) {
	if m := sandbox.Cgroup2Mount(); m != "" {
		return m, nil
	}
	return "", errors.New("no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified")
}

// removeCgroupTree kills and removes a cgroup subtree this process created.
func removeCgroupTree(root string) { sandbox.RemoveCgroupTree(root) }

// countCgroupProcs counts the processes in a cgroup directory.
func countCgroupProcs(path string) int {
	b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
	if err != nil {
		return 0
	}
	return len(strings.Fields(string(b)))
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
