package integration

// Issue 23: nothing lost across a power cut. The runtime dir, the layers
// and the worktree live on a small loop-mounted ext4; a layered fence is
// announced and, at points spread over it, everything of shim's is frozen
// (its whole cgroup root) and the filesystem's image copied: what the
// block device had received is what survives a power cut. Shim then
// starts on the copy and the announcement is retried. After every cut:
// the token never went back, and the abandoned generation's edits are in
// its snapshot ref (made then, or by the retried fence from the layer
// that was kept). SHIM_POWERCUT_ROUNDS makes the run longer.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/testutil"
)

// powerDisk is a loop-mounted ext4 image at mnt (in the test's mount
// namespace, outside the fixture's dir).
type powerDisk struct {
	t        *testing.T
	img, mnt string
	opts     string // mount options
}

// fail makes the filesystem fail as a disk error would (ext4's
// trigger_fs_error): mounted errors=remount-ro, it is read-only from then on.
func (d *powerDisk) fail() {
	d.t.Helper()
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", d.mnt).Output()
	if err != nil {
		d.t.Fatalf("findmnt %s: %v", d.mnt, err)
	}
	dev := filepath.Base(strings.TrimSpace(string(out)))
	if err := os.WriteFile(filepath.Join("/sys/fs/ext4", dev, "trigger_fs_error"), []byte("shim test: a failing disk"), 0); err != nil {
		d.t.Fatalf("trigger an error on %s: %v", dev, err)
	}
}

func newPowerDisk(t *testing.T, opts ...string) *powerDisk {
	t.Helper()
	testutil.NeedTool(t, "mkfs.ext4")
	testutil.NeedTool(t, "losetup")
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil { // the harness's uid passes through to its worktree
		t.Fatal(err)
	}
	d := &powerDisk{t: t, img: filepath.Join(dir, "disk.img"), mnt: filepath.Join(dir, "mnt")}
	if err := os.Mkdir(d.mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("truncate", "-s", "256M", d.img).CombinedOutput(); err != nil {
		t.Fatalf("truncate: %v %s", err, out)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", d.img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	d.opts = strings.Join(append([]string{"loop"}, opts...), ",")
	d.mount(d.img)
	t.Cleanup(d.unmount)
	return d
}

func (d *powerDisk) mount(img string) {
	d.t.Helper()
	if out, err := exec.Command("mount", "-o", d.opts, img, d.mnt).CombinedOutput(); err != nil {
		d.t.Fatalf("mount %s: %v %s", img, err, out)
	}
	if err := os.Chmod(d.mnt, 0o755); err != nil {
		d.t.Fatal(err)
	}
}

// unmount detaches the filesystem (its loop device goes with it: mount's
// autoclear).
func (d *powerDisk) unmount() {
	for i := 0; i < 3 && unix.Unmount(d.mnt, unix.MNT_DETACH) == nil; i++ {
	}
}

// cut copies the image as the block device has it now (shim frozen) and
// puts the copy where the filesystem was.
func (d *powerDisk) cut(n int) {
	d.t.Helper()
	cp := d.img + "." + strconv.Itoa(n)
	if out, err := exec.Command("cp", "--sparse=always", d.img, cp).CombinedOutput(); err != nil {
		d.t.Fatalf("copy the image: %v %s", err, out)
	}
	d.unmount()
	d.img = cp
	d.mount(cp)
}

// freezeTree freezes the cgroup tree at root (the test's own) and waits
// until the kernel says it is frozen.
func freezeTree(t *testing.T, root string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, "cgroup.freeze"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "shim's cgroup root frozen", func() bool {
		b, _ := os.ReadFile(filepath.Join(root, "cgroup.events"))
		return strings.Contains(string(b), "frozen 1")
	})
}

func TestLayerPowerCut(t *testing.T) {
	requireRoot(t)
	rounds := 4
	if v, err := strconv.Atoi(os.Getenv("SHIM_POWERCUT_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	f := newWTFixture(t)
	disk := newPowerDisk(t)
	wt, rd, ly := filepath.Join(disk.mnt, "wt"), filepath.Join(disk.mnt, "run"), filepath.Join(disk.mnt, "layers")
	if out, err := exec.Command("cp", "-a", f.wt, wt).CombinedOutput(); err != nil {
		t.Fatalf("copy the worktree: %v %s", err, out)
	}
	if err := os.Mkdir(rd, 0o700); err != nil {
		t.Fatal(err)
	}
	fw := *f
	fw.wt = wt
	g := script(t, f.bin, "crash.sh", crashGen)
	start := func(n int) []string { return fw.startArgs(n, "--cwd", wt, "--", g, f.out, strconv.Itoa(n)) }
	ready := func(n int) string { return filepath.Join(f.out, "ready."+strconv.Itoa(n)) }
	shim := func() *Shim {
		root := filepath.Join(cgroup2Mount(), randName("shim-it-"))
		t.Cleanup(func() { removeCgroupTree(t, root) })
		s := startShim(t, shimOpts{runtimeDir: rd, cgroupRoot: root,
			args: []string{"--isolation", "auto", "--layers", ly, "--persist", f.out}})
		if iso := layerIsolation(t, s); iso.Mode != "layers" {
			testutil.Need(t, false, fmt.Sprintf("no copy-on-write layers here: %+v", iso))
		}
		return s
	}
	s := shim()
	s.MustCtl(nil, start(1)...)
	cur, highest := 1, uint64(1)
	for i := 0; i < rounds; i++ {
		old, next := cur, cur+1
		eventually(t, 30*time.Second, fmt.Sprintf("gen %d edited", old), func() bool {
			_, err := os.Stat(ready(old))
			return err == nil
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.Ctl(start(next)...)
		}()
		// The cut points spread over the first 400 ms of the fence and
		// the start; where exactly is what the round tests.
		delay := i * 400 / rounds
		time.Sleep(time.Duration(delay) * time.Millisecond)
		freezeTree(t, s.CgroupRoot)
		disk.cut(i)
		s.Stop() // SIGKILL: a frozen task dies too
		<-done
		os.Remove(ready(next))
		s = shim()
		var st api.Status
		s.MustCtl(&st, "status")
		if st.Generation < highest {
			t.Fatalf("round %d (%d ms): the token went back from %d to %d", i, delay, highest, st.Generation)
		}
		var res api.StartResult
		s.MustCtl(&res, start(next)...)
		cur, highest = next, uint64(next)
		if res.Replayed {
			os.Remove(ready(next + 1))
			s.MustCtl(nil, start(next+1)...)
			cur, highest = next+1, uint64(next+1)
		}
		wantCrashGenSaved(t, &fw, old, fmt.Sprintf("round %d (cut %d ms into the fence)", i, delay))
		if out, err := hgitErr(wt, "fsck", "--connectivity-only", "--no-dangling"); err != nil {
			t.Errorf("round %d (%d ms): the repository is not whole after the cut: %v %s", i, delay, err, out)
		}
	}
	s.Stop()
}

// TestLayerFailingDisk: the layers dir's filesystem fails mid-run (ext4
// errors=remount-ro). The fence of the generation on it still saves its
// edits (the layer is read, the snapshot goes to the repository), and the
// next generation falls back to the scan on a clean worktree it can
// write, status naming the disk; under --require-isolation it is refused
// (ISOLATION_UNAVAILABLE), the old generation fenced all the same.
func TestLayerFailingDisk(t *testing.T) {
	for _, require := range []bool{false, true} {
		t.Run(map[bool]string{false: "fallback", true: "require-isolation"}[require], func(t *testing.T) {
			requireRoot(t)
			testutil.NeedTool(t, "findmnt")
			f := newWTFixture(t)
			disk := newPowerDisk(t, "errors=remount-ro")
			ly := filepath.Join(disk.mnt, "layers")
			root := filepath.Join(cgroup2Mount(), randName("shim-it-"))
			t.Cleanup(func() { removeCgroupTree(t, root) })
			args := []string{"--isolation", "auto", "--layers", ly, "--persist", f.out}
			if require {
				args = append(args, "--require-isolation")
			}
			s := startShim(t, shimOpts{cgroupRoot: root, args: args})
			if iso := layerIsolation(t, s); iso.Mode != "layers" {
				testutil.Need(t, false, fmt.Sprintf("no copy-on-write layers here: %+v", iso))
			}
			g := script(t, f.bin, "crash.sh", crashGen)
			s.MustCtl(nil, f.startArgs(1, "--cwd", f.wt, "--", g, f.out, "1")...)
			eventually(t, 30*time.Second, "gen 1 edited", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "ready.1"))
				return err == nil
			})
			disk.fail()
			chk := script(t, f.bin, "check.sh", "cd \"$2\" && git status --porcelain > \"$1/status.2\" 2>&1; echo w > written-by-2.txt; echo $? > \"$1/wrote.2\"; exec sleep 1000\n")
			out, errOut, code := s.Ctl(f.startArgs(2, "--cwd", f.wt, "--", chk, f.out, f.wt)...)
			if require {
				if code != 4 && code != 1 || !strings.Contains(errOut, api.CodeIsolationUnavailable) || !strings.Contains(errOut, ly) {
					t.Fatalf("under --require-isolation: exit %d %s %s, want ISOLATION_UNAVAILABLE naming %s", code, out, errOut, ly)
				}
			} else if code != 0 {
				t.Fatalf("gen 2 did not start on the scan: exit %d %s %s", code, out, errOut)
			}
			// Gen 1's edits are saved either way.
			commit, err := hgitErr(f.wt, "rev-parse", "--verify", "refs/shim/abandoned/1^{commit}")
			if err != nil {
				t.Fatalf("gen 1's snapshot: %v %s", err, commit)
			}
			if got, ok := f.blob(t, strings.TrimSpace(string(commit)), "file-1.txt"); !ok || got != "1\n" {
				t.Errorf("gen 1's snapshot lacks its new file: %q", got)
			}
			if require {
				return
			}
			eventually(t, 30*time.Second, "gen 2 looked and wrote", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "wrote.2"))
				return err == nil
			})
			if b, _ := os.ReadFile(filepath.Join(f.out, "status.2")); len(b) != 0 {
				t.Errorf("gen 2 does not start clean: %q", b)
			}
			if b, _ := os.ReadFile(filepath.Join(f.out, "wrote.2")); strings.TrimSpace(string(b)) != "0" {
				t.Errorf("gen 2 cannot write its worktree: %q", b)
			}
			var st api.Status
			s.MustCtl(&st, "status")
			if st.Isolation.Mode != "scan" || !strings.Contains(st.Isolation.Reason, ly) {
				t.Errorf("status isolation %+v, want scan naming %s", st.Isolation, ly)
			}
			// And the scan fences gen 2 as it would anywhere.
			var r3 api.StartResult
			s.MustCtl(&r3, f.startArgs(3, "--cwd", f.wt, "--", chk, f.out, f.wt)...)
			if len(r3.Fenced) != 1 || r3.Fenced[0].SnapshotRef != "refs/shim/abandoned/2" {
				t.Fatalf("gen 2's fence: %+v", r3.Fenced)
			}
			if got, ok := f.blob(t, r3.Fenced[0].SnapshotCommit, "written-by-2.txt"); !ok || got != "w\n" {
				t.Errorf("gen 2's snapshot lacks its file: %q", got)
			}
		})
	}
}
