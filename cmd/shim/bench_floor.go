package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shimdev/shim/internal/sandbox"
	"golang.org/x/sys/unix"
)

// A floorRig measures the composite kernel floor of a fence over one
// checkout: what the kernel alone needs for the same outcome, saving
// nothing. Its overlays are mounted in a mount namespace of one locked
// thread of this process (private: nothing reaches the host's), its
// processes live in a cgroup subtree it made; close removes all of it.
type floorRig struct {
	wt, dir, mnt string
	cgroup       string
	n, round     int
	ns           *sandbox.MountNS
}

func newFloorRig(wt, dir string, n int) (*floorRig, error) {
	mnt, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 4)
	rand.Read(b)
	r := &floorRig{wt: wt, dir: dir, mnt: filepath.Join(dir, "mnt"), n: n,
		cgroup: filepath.Join(mnt, "shim-bench-floor-"+hex.EncodeToString(b))}
	if err := os.MkdirAll(r.mnt, 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(r.cgroup, 0o755); err != nil {
		return nil, err
	}
	if r.ns, err = sandbox.NewMountNS(); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *floorRig) do(fn func() error) error { return r.ns.Do(fn) }

func (r *floorRig) close() {
	if r.ns != nil {
		r.do(func() error { return unix.Unmount(r.mnt, unix.MNT_DETACH) })
		r.ns.Close()
	}
	removeCgroupTree(r.cgroup)
	os.RemoveAll(r.dir)
}

// mount mounts a fresh, empty layer over the checkout at r.mnt.
func (r *floorRig) mount(name string) error {
	ld := filepath.Join(r.dir, name)
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(ld, d), 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,index=off,metacopy=off",
		r.wt, filepath.Join(ld, "upper"), filepath.Join(ld, "work"))
	return unix.Mount("shim-bench-floor", r.mnt, "overlay", 0, opts)
}

// startIn forks and execs a sleeping process into a new cgroup name, its
// cwd the mounted layer.
func (r *floorRig) startIn(name string) (*exec.Cmd, error) {
	cg := filepath.Join(r.cgroup, name)
	if err := os.Mkdir(cg, 0o755); err != nil {
		return nil, err
	}
	fd, err := syscall.Open(cg, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	cmd := exec.Command("sleep", "1000000")
	cmd.Dir = r.mnt
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, Setsid: true}
	return cmd, cmd.Start()
}

// measure is one round: a process in a cgroup over a layer in which
// changed files were changed, then, timed, the floor: freeze (confirmed),
// cgroup.kill until empty, unmount, mount an empty upper, fork/exec the
// next process into a new cgroup. It returns the floor and its fork/exec
// part (ms).
func (r *floorRig) measure(changed int) (total, start float64, err error) {
	r.round++
	a, b := "a"+strconv.Itoa(r.round), "b"+strconv.Itoa(r.round)
	var old, next *exec.Cmd
	err = r.do(func() error {
		if err := r.mount(a); err != nil {
			return err
		}
		for k := 0; k < changed; k++ {
			if err := os.WriteFile(filepath.Join(r.mnt, benchPath(k*r.n/changed)), []byte("edited\n"), 0o644); err != nil {
				return err
			}
		}
		var err error
		if old, err = r.startIn(a); err != nil {
			return err
		}
		t0 := time.Now()
		if err := cgroupWriteWait(filepath.Join(r.cgroup, a), "cgroup.freeze", "frozen 1"); err != nil {
			return err
		}
		if err := cgroupWriteWait(filepath.Join(r.cgroup, a), "cgroup.kill", "populated 0"); err != nil {
			return err
		}
		if err := unix.Unmount(r.mnt, 0); err != nil {
			return fmt.Errorf("unmount: %w", err)
		}
		if err := r.mount(b); err != nil {
			return err
		}
		t1 := time.Now()
		next, err = r.startIn(b)
		total, start = ms(time.Since(t0)), ms(time.Since(t1))
		return err
	})
	r.cleanup(old, next, a, b)
	return total, start, err
}

// cleanup ends the round's processes (its own children), unmounts its
// layer and removes its cgroups and dirs.
func (r *floorRig) cleanup(old, next *exec.Cmd, a, b string) {
	for _, c := range []*exec.Cmd{old, next} {
		if c != nil && c.Process != nil {
			c.Process.Kill()
			//shimlint:allow onereaper: shim bench runs as a command, not as PID 1
			c.Wait()
		}
	}
	r.do(func() error { return unix.Unmount(r.mnt, unix.MNT_DETACH) })
	for _, n := range []string{a, b} {
		os.Remove(filepath.Join(r.cgroup, n))
		os.RemoveAll(filepath.Join(r.dir, n))
	}
}

// cgroupWriteWait writes 1 to a cgroup's file and waits until its
// cgroup.events says want (the kernel's confirmation).
func cgroupWriteWait(cg, file, want string) error {
	if err := os.WriteFile(filepath.Join(cg, file), []byte("1"), 0); err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ev, err := os.ReadFile(filepath.Join(cg, "cgroup.events"))
		if err != nil {
			return err
		}
		if strings.Contains(string(ev), want) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no %q after %s", cg, want, file)
		}
	}
}
