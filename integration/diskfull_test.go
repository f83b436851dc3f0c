package integration

// Issue 23: a harness that fills the layers' filesystem harms no later
// generation. The worktree and the layers share a small filesystem (ext4,
// and tmpfs), as they do in a container's root; generation 1 writes
// zeros until the filesystem is full (through its overlay, whose writes
// carry shim's credentials: ext4's root-reserved blocks go too). Shim
// keeps --layers-reserve bytes there that no harness can take: the fence
// spends them on gen 1's snapshot and marker, the fenced layer goes
// because the filesystem is short of room, the reserve is taken again,
// and gen 2 starts on its own layers with room to write. The control,
// without the reserve, shows the harm it prevents.

import (
	"encoding/json"
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

// fillGen writes its edits, then zeros in files of 16 MiB (each under the
// snapshot's file cap; zeros compress, so a snapshot of them is small)
// until the filesystem refuses.
const fillGen = `
OUT=$1
echo 1 > file-1.txt
i=0
while head -c 16777216 /dev/zero > fill.$i 2>/dev/null; do i=$((i+1)); done
echo $i > "$OUT/filled.1"
touch "$OUT/ready.1"
exec sleep 1000
`

// smallTmpfs mounts a tmpfs of size bytes at a new dir (in the test's
// mount namespace) and returns it.
func smallTmpfs(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("shim-test", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size="+strconv.FormatInt(size, 10)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}

func TestLayerDiskFull(t *testing.T) {
	for _, fsType := range []string{"ext4", "tmpfs"} {
		for _, reserve := range []bool{true, false} {
			name := fsType + map[bool]string{true: "/reserve", false: "/control-no-reserve"}[reserve]
			t.Run(name, func(t *testing.T) { layerDiskFull(t, fsType, reserve) })
		}
	}
}

func layerDiskFull(t *testing.T, fsType string, reserve bool) {
	requireRoot(t)
	f := newWTFixture(t)
	var mnt string
	if fsType == "ext4" {
		mnt = newPowerDisk(t).mnt
	} else {
		mnt = smallTmpfs(t, 256<<20)
	}
	wt, ly := filepath.Join(mnt, "wt"), filepath.Join(mnt, "layers")
	if out, err := exec.Command("cp", "-a", f.wt, wt).CombinedOutput(); err != nil {
		t.Fatalf("copy the worktree: %v %s", err, out)
	}
	fw := *f
	fw.wt = wt
	root := filepath.Join(cgroup2Mount(), randName("shim-it-"))
	t.Cleanup(func() { removeCgroupTree(t, root) })
	args := []string{"--isolation", "auto", "--layers", ly, "--persist", f.out}
	if !reserve {
		args = append(args, "--layers-reserve", "-1")
	}
	s := startShim(t, shimOpts{cgroupRoot: root, args: args})
	if iso := layerIsolation(t, s); iso.Mode != "layers" {
		testutil.Need(t, false, fmt.Sprintf("no copy-on-write layers here: %+v", iso))
	}
	fill := script(t, f.bin, "fill.sh", fillGen)
	s.MustCtl(nil, fw.startArgs(1, "--cwd", wt, "--", fill, f.out)...)
	eventually(t, 120*time.Second, "gen 1 filled the filesystem", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready.1"))
		return err == nil
	})
	var fs unix.Statfs_t
	if err := unix.Statfs(mnt, &fs); err != nil {
		t.Fatal(err)
	}
	filled, _ := os.ReadFile(filepath.Join(f.out, "filled.1"))
	t.Logf("gen 1 wrote %s files of 16 MiB; %d bytes left to root on the %s", strings.TrimSpace(string(filled)), int64(fs.Bfree)*int64(fs.Bsize), fsType)

	chk := script(t, f.bin, "check.sh", "cd \"$2\" && git status --porcelain > \"$1/status.2\" 2>&1; "+
		"head -c 1048576 /dev/zero > written-by-2.bin; echo $? > \"$1/wrote.2\"; exec sleep 1000\n")
	out, errOut, code := s.Ctl(fw.startArgs(2, "--cwd", wt, "--", chk, f.out, wt)...)
	var r2 api.StartResult
	if code == 0 {
		if err := json.Unmarshal([]byte(out), &r2); err != nil {
			t.Fatalf("gen 2's answer: %v %s", err, out)
		}
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if err := unix.Statfs(mnt, &fs); err != nil {
		t.Fatal(err)
	}
	t.Logf("after gen 2 started: %d bytes available on the %s; reserve held %d of %d; isolation %s %q", int64(fs.Bavail)*int64(fs.Bsize), fsType,
		st.Isolation.ReserveHeldBytes, st.Isolation.ReserveBytes, st.Isolation.Mode, st.Isolation.Reason)
	wrote := func() string {
		eventually(t, 30*time.Second, "gen 2 looked and wrote", func() bool {
			_, err := os.Stat(filepath.Join(f.out, "wrote.2"))
			return err == nil
		})
		b, _ := os.ReadFile(filepath.Join(f.out, "wrote.2"))
		return strings.TrimSpace(string(b))
	}
	if !reserve {
		// The control: without the reserve, gen 1's snapshot, its marker
		// or gen 2's room is lost to what gen 1 wrote.
		harmed := code != 0 || len(r2.Fenced) != 1 || r2.Fenced[0].SnapshotRef == "" ||
			(r2.Fenced[0].Worktree != nil && r2.Fenced[0].Worktree.MarkerError != "") ||
			len(st.Isolation.Pinned) > 0 || st.Isolation.Mode != "layers" || wrote() != "0"
		if !harmed {
			t.Fatalf("control: without a reserve a full filesystem harmed nothing (answer %s %s; status %+v); the test does not show what the reserve does", out, errOut, st.Isolation)
		}
		t.Logf("control: exit %d; fenced %+v; isolation %s %q, pinned %d", code, r2.Fenced, st.Isolation.Mode, st.Isolation.Reason, len(st.Isolation.Pinned))
		return
	}
	if code != 0 {
		t.Fatalf("gen 2 was not started: exit %d %s %s", code, out, errOut)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("gen 1's fence: %+v", r2.Fenced)
	}
	if w := r2.Fenced[0].Worktree; w == nil || w.MarkerError != "" || w.Isolation != "layers" {
		t.Fatalf("gen 1's worktree report: %+v", w)
	}
	if got, ok := fw.blob(t, r2.Fenced[0].SnapshotCommit, "file-1.txt"); !ok || got != "1\n" {
		t.Errorf("gen 1's snapshot lacks its edit: %q", got)
	}
	if got := fw.blobSize(t, r2.Fenced[0].SnapshotCommit, "fill.0"); got != 16<<20 {
		t.Errorf("gen 1's snapshot lacks its first fill file (%d bytes)", got)
	}
	if st.Isolation.Mode != "layers" || len(st.Isolation.Pinned) != 0 || st.Error != nil || st.Isolation.ReserveHeldBytes <= 0 {
		t.Fatalf("status after the fence: isolation %+v, error %+v", st.Isolation, st.Error)
	}
	if got := wrote(); got != "0" {
		t.Errorf("gen 2 cannot write its worktree (exit %s)", got)
	}
	if b, _ := os.ReadFile(filepath.Join(f.out, "status.2")); len(b) != 0 {
		t.Errorf("gen 2 does not start clean: %q", b)
	}
	// And the next fence of a generation that wrote little keeps the
	// reserve where it is.
	var r3 api.StartResult
	s.MustCtl(&r3, fw.startArgs(3, "--cwd", wt, "--", chk, f.out, wt)...)
	if len(r3.Fenced) != 1 || r3.Fenced[0].SnapshotRef != "refs/shim/abandoned/2" {
		t.Fatalf("gen 2's fence: %+v", r3.Fenced)
	}
	s.MustCtl(&st, "status")
	if st.Isolation.ReserveHeldBytes <= 0 || len(st.Isolation.Pinned) != 0 {
		t.Errorf("status after gen 2's fence: %+v", st.Isolation)
	}
}
