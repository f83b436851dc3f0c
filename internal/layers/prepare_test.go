package layers

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// A prepared stub mounts its root layer and binds the sandbox's mounts
// back in as soon as it has its plan, and nothing of a worktree: the
// worktree overlays (their lowers are restored until the launch) are
// mounted at the launch, bound into the merged root, then the shared
// paths and the pivot. The view is the one mount builds.
func TestAPreparedStubMountsItsRootBeforeItsLaunchAndItsWorktreesAfter(t *testing.T) {
	p, sandbox, volume := stubPlan(t)
	k := useFakeKernel(t, sandbox...)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	c, err := net.FileConn(os.NewFile(uintptr(fds[0]), "shim"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := Prepare(c.(*net.UnixConn), p); err != nil {
		t.Fatal(err)
	}
	prep, err := prepare(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	m, w := p.Root.Merged, p.Worktrees[0]
	k.inOrder(t, "overlay "+m+" lowerdir=/,upperdir="+p.Root.Upper, "bind /proc "+m+"/proc rec", "tmpfs "+m+"/tmp mode=1777",
		"bind "+volume+" "+m+volume+" rec")
	k.never(t, "overlay "+w.Path, "bind "+w.Path, "bind "+p.Bind[0], "pivot")
	if !sameMounts(prep, p) {
		t.Fatalf("the plan received is not the one sent: %+v", prep)
	}
	other := *p
	other.Worktrees = []WorktreeLayer{{Path: w.Path, Upper: w.Upper + "x", Work: w.Work}}
	if sameMounts(prep, &other) {
		t.Error("a launch with another worktree layer passes for the prepared one")
	}
	launched := *p
	launched.prepared = true
	if err := launched.mountLaunched(); err != nil {
		t.Fatal(err)
	}
	k.inOrder(t, "bind "+volume+" "+m+volume+" rec",
		"overlay "+w.Path+" lowerdir="+escapeOpt(w.Path)+",upperdir="+w.Upper,
		"bind "+w.Path+" "+m+w.Path+" rec",
		"bind "+p.Bind[0]+" "+m+p.Bind[0]+" rec",
		"pivot "+m)
	k.never(t, "bind "+p.Hide[0], "bind "+p.Bind[1], "bind "+m+" ", "bind /tmp ", "bind /dev/shm")
}

// A stub given a plan that is not one, or a launch whose plan mounts
// other layers than the prepared one, mounts nothing more and says why.
func TestAPreparedStubRefusesAPlanItCannotRead(t *testing.T) {
	k := useFakeKernel(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	unix.Write(fds[0], []byte{0, 0, 0, 5, '{', 'h', 'a', 'l', 'f'})
	if _, err := prepare(fds[1]); err == nil {
		t.Fatal("half a plan was taken for one")
	}
	k.never(t, "overlay", "tmpfs", "bind", "pivot")
}
