package layers

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// stubPlan is a generation's plan over temporary directories, and the
// sandbox's mounts as the fake kernel lists them: the root, /proc, /dev
// with /dev/shm and a message queue below it, /tmp with a volume below it
// (carried), and the layers dir (hidden).
func stubPlan(t *testing.T) (*Plan, []mountEntry, string) {
	t.Helper()
	base := t.TempDir()
	mk := func(p string) string {
		d := filepath.Join(base, p)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	layersDir, volume, shared := mk("layers"), mk("volume"), mk("shared")
	p := &Plan{
		Generation: 9,
		Root:       &RootLayer{Upper: mk("layers/root/9/upper"), Work: mk("layers/root/9/work"), Merged: mk("layers/root/9/merged")},
		Worktrees:  []WorktreeLayer{{Path: mk("w,1"), Upper: mk("layers/wt/k/9/upper"), Work: mk("layers/wt/k/9/work")}},
		Bind:       []string{shared, filepath.Join(layersDir, "lower"), ""},
		Hide:       []string{layersDir},
	}
	sandbox := []mountEntry{
		{id: "27", parent: "1", point: "/", fstype: "overlay"},
		{id: "22", parent: "27", point: "/proc", fstype: "proc"},
		{id: "24", parent: "27", point: "/dev", fstype: "tmpfs"},
		{id: "25", parent: "24", point: "/dev/shm", fstype: "tmpfs"},
		{id: "26", parent: "24", point: "/dev/mqueue", fstype: "mqueue"},
		{id: "30", parent: "27", point: "/tmp", fstype: "tmpfs"},
		{id: "31", parent: "30", point: volume, fstype: "ext4"},
		{id: "40", parent: "27", point: layersDir, fstype: "ext4"},
	}
	return p, sandbox, volume
}

// The stub builds the generation's view in this order: its mounts made
// private (nothing reaches shim's namespace), the worktree overlays in
// place, the root overlay, the sandbox's mounts bound back in (fresh
// tmpfs for /tmp and /dev/shm, a fresh message queue, what was below a
// fresh one carried over), the shared paths, then the pivot. The layers
// dir and the merged root are never bound in.
func TestTheStubBuildsTheViewInOrder(t *testing.T) {
	p, sandbox, volume := stubPlan(t)
	k := useFakeKernel(t, sandbox...)
	if err := p.mount(); err != nil {
		t.Fatal(err)
	}
	m, w := p.Root.Merged, p.Worktrees[0]
	k.inOrder(t,
		"private /",
		"overlay "+w.Path+" lowerdir="+escapeOpt(w.Path)+",upperdir="+w.Upper+",workdir="+w.Work+",redirect_dir=off,index=off,metacopy=off",
		"overlay "+m+" lowerdir=/,upperdir="+p.Root.Upper,
		"bind /proc "+m+"/proc rec",
		"bind /dev "+m+"/dev rec",
		"tmpfs "+m+"/tmp mode=1777",
		"bind "+w.Path+" "+m+w.Path+" rec", // the worktree's overlay, as the sandbox now has it
		"tmpfs "+m+"/dev/shm mode=1777",
		"mqueue "+m+"/dev/mqueue",
		"bind "+volume+" "+m+volume+" rec",
		"bind "+p.Bind[0]+" "+m+p.Bind[0]+" rec",
		"pivot "+m,
	)
	k.never(t, "bind "+p.Hide[0], "bind "+p.Bind[1], "bind "+m+" ", "bind /tmp ", "bind /dev/shm")
	if !strings.Contains(escapeOpt(w.Path), `\,`) {
		t.Error("a comma in a path must be escaped in the overlay's options")
	}
	if st, err := os.Stat(m + volume); err != nil || !st.IsDir() {
		t.Errorf("a carried mount's point is made below the fresh tmpfs: %v", err)
	}
}

// A bound file gets an empty file to be bound on, not a directory.
func TestABoundFileGetsAFileToBeBoundOn(t *testing.T) {
	k := useFakeKernel(t)
	src := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(src, []byte("nameserver 10.0.0.1\n"), 0o644)
	dst := filepath.Join(t.TempDir(), "merged", "etc", "resolv.conf")
	if err := bindAt(src, dst); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dst); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("%v %v", st, err)
	}
	k.inOrder(t, "bind "+src+" "+dst+" rec")
	if err := bindAt(filepath.Join(t.TempDir(), "missing"), dst); err == nil {
		t.Error("a source that is not there")
	}
}

// A step that fails ends the stub's build there: the error names the
// step, and nothing after it (above all the pivot and the harness) runs
// on a half-made view.
func TestAStubStepThatFailsStopsTheBuild(t *testing.T) {
	p0, _, volume := stubPlan(t)
	for _, tc := range []struct{ fail, want string }{
		{"private", "make mounts private"},
		{"overlay " + p0.Worktrees[0].Path, "worktree layer on"},
		{"overlay " + p0.Root.Merged, "root layer"},
		{"bind /proc", "bind /proc"},
		{"tmpfs " + p0.Root.Merged + "/tmp", "fresh /tmp"},
		{"tmpfs " + p0.Root.Merged + "/dev/shm", "fresh /dev/shm"},
		{"mqueue", "fresh /dev/mqueue"},
		{"bind " + volume, "bind " + volume},
		{"bind " + p0.Bind[0], "bind " + p0.Bind[0]},
	} {
		t.Run(tc.want, func(t *testing.T) {
			p, sandbox, _ := stubPlan(t)
			// the same step of this plan's paths
			fail := strings.NewReplacer(p0.Root.Merged, p.Root.Merged, p0.Worktrees[0].Path, p.Worktrees[0].Path, volume, sandbox[6].point, p0.Bind[0], p.Bind[0]).Replace(tc.fail)
			want := strings.NewReplacer(volume, sandbox[6].point, p0.Bind[0], p.Bind[0]).Replace(tc.want)
			k := useFakeKernel(t, sandbox...)
			k.fail[fail] = errFake
			err := p.mount()
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %v, want it to name %q", err, want)
			}
			k.never(t, "pivot")
		})
	}
}

// A stub that cannot build the view reports why on its socket and exits
// without running the harness; the probe's root layer gets a tmpfs of
// its own first.
func TestAStubThatCannotMountReportsWhyAndRunsNothing(t *testing.T) {
	p, sandbox, _ := stubPlan(t)
	p.RootTmpfs = filepath.Dir(p.Root.Upper)
	for _, d := range []string{p.Root.Upper, p.Root.Work, p.Root.Merged} {
		os.Remove(d)
	}
	k := useFakeKernel(t, sandbox...)
	k.fail["overlay "+p.Root.Merged] = errFake
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	p.Ready = fds[1]
	if got := p.run(-1, "/bin/true", []string{"true"}, nil); got != 127 {
		t.Fatalf("exit %d", got)
	}
	buf := make([]byte, 512)
	n, _ := unix.Read(fds[0], buf)
	if msg := string(buf[:n]); !strings.Contains(msg, "layers of generation 9: root layer") {
		t.Fatalf("report %q", msg)
	}
	k.inOrder(t, "tmpfs "+p.RootTmpfs+" mode=0700,size=1m", "overlay "+p.Root.Merged)
	for _, d := range []string{p.Root.Upper, p.Root.Work, p.Root.Merged} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("the probe's root layer dir %s is not made on its tmpfs: %v", d, err)
		}
	}
}

// A stub whose start is given up (shim closes the socket without a
// launch) ends without mounting its layers, and says why on the socket.
func TestAStubWhoseStartIsGivenUpEnds(t *testing.T) {
	for name, send := range map[string]string{
		"nothing sent":  "",
		"not a launch":  `{"path":""}`,
		"not even json": `{half`,
	} {
		t.Run(name, func(t *testing.T) {
			k := useFakeKernel(t)
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[1])
			if send != "" {
				unix.Write(fds[0], []byte(send))
			}
			unix.Shutdown(fds[0], unix.SHUT_WR)
			defer unix.Close(fds[0])
			if got := RunStub([]string{"fd:" + strconv.Itoa(fds[1])}); got != 127 {
				t.Fatalf("exit %d", got)
			}
			buf := make([]byte, 512)
			n, _ := unix.Read(fds[0], buf)
			if msg := string(buf[:max(n, 0)]); msg == "" {
				t.Error("the stub did not say why")
			}
			k.inOrder(t, "private /")
			k.never(t, "overlay", "tmpfs", "bind", "pivot")
		})
	}
}

// The stub goes to the harness's cwd inside the view; one that is not
// there fails the start.
func TestTheStubEntersTheHarnesssCwd(t *testing.T) {
	t.Chdir(t.TempDir()) // restored after the test
	want := t.TempDir()
	if err := (&Plan{Cwd: want}).enter(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.Getwd(); got != want {
		t.Errorf("cwd %s, want %s", got, want)
	}
	if err := (&Plan{Cwd: filepath.Join(want, "missing")}).enter(); err == nil || !strings.Contains(err.Error(), "chdir") {
		t.Errorf("a cwd that is not there: %v", err)
	}
}
