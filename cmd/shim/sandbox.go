package main

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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shimdev/shim/client"
)

// localShim is a shim init started by demo and bench as PID 1 of fresh pid
// and mount namespaces, with a temporary runtime dir and its own cgroup
// subtree; close removes all of it.
type localShim struct {
	cmd        *exec.Cmd
	runtimeDir string
	cgroupRoot string
	client     *client.Client
	done       chan struct{}
	exitCode   int
}

// cgroup2Mount finds the cgroup2 mount: /sys/fs/cgroup on a pure cgroup2
// host, /sys/fs/cgroup/unified on a hybrid one.
func cgroup2Mount() (string, error) {
	for _, m := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st syscall.Statfs_t
		if syscall.Statfs(m, &st) == nil && st.Type == 0x63677270 {
			return m, nil
		}
	}
	return "", errors.New("no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified")
}

func startLocalShim(name string, log io.Writer, extra ...string) (*localShim, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("run as root: shim needs to create namespaces and cgroups")
	}
	mnt, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	rd, err := os.MkdirTemp("", "shim-"+name+"-")
	if err != nil {
		return nil, err
	}
	b := make([]byte, 4)
	rand.Read(b)
	ls := &localShim{runtimeDir: rd, cgroupRoot: filepath.Join(mnt, "shim-"+name+"-"+hex.EncodeToString(b)), done: make(chan struct{})}
	args := append([]string{"init", "--runtime-dir", rd, "--cgroup-root", ls.cgroupRoot, "--mount-proc"}, extra...)
	ls.cmd = exec.Command(self, args...)
	ls.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	ls.cmd.Stdout, ls.cmd.Stderr = log, log
	ls.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if err := ls.cmd.Start(); err != nil {
		os.RemoveAll(rd)
		return nil, err
	}
	go func() {
		ls.cmd.Wait()
		ls.exitCode = ls.cmd.ProcessState.ExitCode()
		close(ls.done)
	}()
	ls.client = client.New(rd)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := ls.client.Health(ctx)
		cancel()
		if err == nil {
			return ls, nil
		}
		select {
		case <-ls.done:
			ls.close()
			return nil, fmt.Errorf("shim exited at start with code %d", ls.exitCode)
		default:
		}
		if time.Now().After(deadline) {
			ls.close()
			return nil, fmt.Errorf("shim not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// close stops shim (SIGTERM, then SIGKILL) and removes everything it made.
func (ls *localShim) close() {
	select {
	case <-ls.done:
	default:
		ls.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-ls.done:
		case <-time.After(15 * time.Second):
			ls.cmd.Process.Kill()
			<-ls.done
		}
	}
	removeCgroupTree(ls.cgroupRoot)
	os.RemoveAll(ls.runtimeDir)
}

// removeCgroupTree kills whatever is left in a cgroup subtree this process
// created and removes it, leaves first.
func removeCgroupTree(root string) {
	var dirs []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		os.WriteFile(filepath.Join(dirs[i], "cgroup.kill"), []byte("1"), 0)
		for j := 0; j < 100; j++ {
			if err := os.Remove(dirs[i]); err == nil || os.IsNotExist(err) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// countCgroupProcs counts the processes in a cgroup directory.
func countCgroupProcs(path string) int {
	b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
	if err != nil {
		return 0
	}
	return len(strings.Fields(string(b)))
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
