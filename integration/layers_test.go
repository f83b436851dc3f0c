package integration

// Issue 10 end to end: every generation on copy-on-write layers (shim init
// --isolation auto). The harness is wtUID, the same uid for every
// generation, owning the worktree. Shim runs as PID 1 of its own pid and
// mount namespaces (startShim: --mount-proc makes every mount private
// before shim mounts anything), its layers under the fixture's temp dir,
// so no layer mount reaches the host; each test checks that none did.
// Every attack has its control in --isolation scan, where it works.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/testutil"
)

// layerRig is a worktree fixture and a shim in one isolation mode, its
// layers under the fixture, the fixture's out dir declared shared
// (--persist: the harnesses report there, and the test reads it).
type layerRig struct {
	f      *wtFixture
	s      *Shim
	layers string
	o      shimOpts
}

// newLayerRig starts shim with --isolation iso. For "auto" it needs
// layers to be available here (testutil.Need: skipped, or failed under
// SHIM_REQUIRE_INTEGRATION=1, where they are not).
func newLayerRig(t *testing.T, iso string, extra ...string) *layerRig {
	t.Helper()
	return newLayerRigWith(t, layerOpts{iso: iso, extra: extra})
}

type layerOpts struct {
	iso      string
	o        shimOpts // its runtime dir and cgroup root
	extra    []string // more flags of shim init
	shareBin bool     // the fixture's bin and in dirs are --persist too
}

func newLayerRigWith(t *testing.T, lo layerOpts) *layerRig {
	t.Helper()
	f := newWTFixture(t)
	r := &layerRig{f: f, layers: filepath.Join(f.work, "layers"), o: lo.o}
	r.o.args = append([]string{"--isolation", lo.iso, "--layers", r.layers, "--persist", f.out}, lo.extra...)
	if lo.shareBin {
		r.o.args = append(r.o.args, "--persist", f.bin, "--persist", f.in)
	}
	t.Cleanup(func() { layerNoLeak(t, f.work) })
	r.start(t)
	return r
}

// start starts (or restarts) the rig's shim and checks its isolation mode.
func (r *layerRig) start(t *testing.T) {
	t.Helper()
	r.s = startShim(t, r.o)
	t.Cleanup(func() { layerNoLeak(t, r.f.work) }) // before this shim stops, and again after
	iso := layerIsolation(t, r.s)
	want := isolationArg(r.o.args)
	if want == "auto" {
		testutil.Need(t, iso.Mode == "layers", fmt.Sprintf("no copy-on-write layers here: %+v", iso))
		if iso.Dir != r.layers {
			t.Errorf("status isolation dir %q, want %q", iso.Dir, r.layers)
		}
		return
	}
	if iso.Mode != "scan" || iso.Reason == "" {
		t.Fatalf("--isolation scan: status isolation %+v", iso)
	}
}

func isolationArg(args []string) string {
	for i, a := range args {
		if a == "--isolation" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// layerIsolation waits until shim has probed its isolation mode (it does
// so in the background at start) and returns it.
func layerIsolation(t *testing.T, s *Shim) api.Isolation {
	t.Helper()
	var st api.Status
	eventually(t, 30*time.Second, "isolation probed", func() bool {
		s.MustCtl(&st, "status")
		return st.Isolation.Mode != "probing"
	})
	return st.Isolation
}

// layerNoLeak fails the test when a mount below dir is visible in the
// test's own mount namespace: the layers must stay in shim's and the
// generations' namespaces.
func layerNoLeak(t *testing.T, dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Errorf("mountinfo: %v", err)
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			t.Errorf("a mount of shim's leaked into the test's namespace: %s", line)
		}
	}
}

// genView is where the test reads what generation gen's harness sees at
// path: through /proc/PID/root of a process in gen's cgroup (its mount
// namespace, its worktree layer).
func genView(t *testing.T, s *Shim, gen uint64, path string) string {
	t.Helper()
	// The oldest process of the cgroup, its harness, not any one: a
	// short-lived child (a git the harness runs) may be gone by the time
	// its root is read. (The record's pid is in shim's pid namespace.)
	var pid int
	eventually(t, 10*time.Second, fmt.Sprintf("a process of generation %d", gen), func() bool {
		pid = oldest(atkGenProcs(s, gen))
		return pid > 0
	})
	return filepath.Join(fmt.Sprintf("/proc/%d/root", pid), path)
}

// oldest is the pid that started first (field 22 of /proc/PID/stat), 0
// when none can be read.
func oldest(pids []int) int {
	best, bestStart := 0, uint64(0)
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 20 {
			continue
		}
		start, err := strconv.ParseUint(f[19], 10, 64)
		if err == nil && (best == 0 || start < bestStart) {
			best, bestStart = p, start
		}
	}
	return best
}

// treeEntries describes every file below dir but .git (directories are
// implied, as git has them): a regular file as its exec bit and bytes, a
// symlink as its target.
func treeEntries(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, dir+"/")
		if p == dir || d.IsDir() {
			if d.Name() == ".git" && p != dir {
				return filepath.SkipDir
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "symlink -> " + target
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			kind := "file"
			if info.Mode()&0o100 != 0 {
				kind = "exec"
			}
			out[rel] = fmt.Sprintf("%s %q", kind, b)
		default:
			out[rel] = "special " + info.Mode().String()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return out
}

// diffTrees lists how got differs from want.
func diffTrees(want, got map[string]string) []string {
	var d []string
	for p, w := range want {
		if g, ok := got[p]; !ok {
			d = append(d, fmt.Sprintf("%s: missing (want %.80s)", p, w))
		} else if g != w {
			d = append(d, fmt.Sprintf("%s: %.80s, want %.80s", p, g, w))
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			d = append(d, fmt.Sprintf("%s: unexpected %.80s", p, g))
		}
	}
	return d
}

// baseEntries is the baseline's tree as treeEntries describes it.
func (f *wtFixture) baseEntries() map[string]string {
	out := map[string]string{}
	for p, c := range f.base {
		out[p] = fmt.Sprintf("file %q", c)
	}
	return out
}

// checkout checks commit out with plain git into a fresh clone of the
// worktree's repository and returns the clone.
func (f *wtFixture) checkout(t testing.TB, commit string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "recovered")
	// A local transport drops -c: its upload-pack needs its own, as the
	// repository is the harness's uid's.
	up := "git -c safe.directory=* upload-pack"
	hgit(t, f.work, "clone", "-q", "--no-checkout", "--upload-pack", up, f.wt, dst)
	hgit(t, dst, "fetch", "-q", "--upload-pack", up, "origin", commit)
	hgit(t, dst, "checkout", "-q", "--detach", commit)
	return dst
}

// ---- 1. the clean room ----

// cleanRoomGen1 plants, as the harness's uid, what the next generation's
// git, bash and python would run (HOME dotfiles, a user-site .pth), files
// in /tmp, /var/tmp and /dev/shm, SysV IPC objects and a POSIX message
// queue, and one file in the shared dir. $1 is the shared dir, $2 a token
// naming what it plants outside HOME.
const cleanRoomGen1 = `
set -e
OUT=$1 TOK=$2
python3 - "$TOK" <<'EOF'
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.mq_open(("/shim-planted-" + sys.argv[1]).encode(), os.O_CREAT | os.O_RDWR, 0o600, None) < 0:
    sys.exit("mq_open: errno %d" % ctypes.get_errno())
EOF
mkdir -p "$HOME/hooks"
printf '#!/bin/sh\necho hook >> "%s/marker"\nexit 0\n' "$OUT" > "$HOME/hooks/pre-commit"
printf '#!/bin/sh\necho fsmonitor >> "%s/marker"\nexit 1\n' "$OUT" > "$HOME/hooks/fsmonitor"
chmod 755 "$HOME/hooks/pre-commit" "$HOME/hooks/fsmonitor"
printf '[core]\n\thooksPath = %s/hooks\n\tfsmonitor = %s/hooks/fsmonitor\n' "$HOME" "$HOME" > "$HOME/.gitconfig"
printf 'echo bashrc >> "%s/marker"\n' "$OUT" > "$HOME/.bashrc"
site=$(python3 -m site --user-site)
mkdir -p "$site"
printf 'import sys; print("pth", file=open("%s/marker", "a"))\n' "$OUT" > "$site/shim-planted.pth"
for d in /tmp /var/tmp /dev/shm; do echo gen1 > "$d/shim-planted-$TOK"; done
ipcmk -M 4096 | awk '{print $NF}' > "$OUT/shmid"
ipcmk -Q | awk '{print $NF}' > "$OUT/msgid"
ipcmk -S 1 | awk '{print $NF}' > "$OUT/semid"
echo gen1 > "$OUT/shared-by-gen1"
touch "$OUT/ready"
exec sleep 1000
`

// cleanRoomGen2 looks for everything gen 1 planted (found: one line each),
// then runs git (status: the fsmonitor; commit: the hook), an interactive
// bash and python, the way any harness would. The payloads write marker.
const cleanRoomGen2 = `
OUT=$1 TOK=$2
rm -f "$OUT/marker"
found=$OUT/found
: > "$found"
site=$(python3 -m site --user-site)
for p in "$HOME/.gitconfig" "$HOME/.bashrc" "$HOME/hooks" "$site/shim-planted.pth" \
	/tmp/shim-planted-$TOK /var/tmp/shim-planted-$TOK /dev/shm/shim-planted-$TOK; do
	[ -e "$p" ] && echo "$p" >> "$found"
done
ipc() { awk -v id="$(cat "$OUT/$2")" 'NR > 1 && $2 == id { f = 1 } END { exit !f }' /proc/sysvipc/$1; }
ipc shm shmid && echo sysv-shm >> "$found"
ipc msg msgid && echo sysv-msg >> "$found"
ipc sem semid && echo sysv-sem >> "$found"
python3 - "$TOK" <<'EOF' && echo posix-mqueue >> "$found"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.mq_open(("/shim-planted-" + sys.argv[1]).encode(), os.O_RDONLY) >= 0 else 1)
EOF
cat "$OUT/shared-by-gen1" > "$OUT/shared-seen" 2>/dev/null
git status > /dev/null 2>&1
git commit -q --allow-empty -m "gen 2 probe" > /dev/null 2>&1
bash -i -c true < /dev/null > /dev/null 2>&1
python3 -c pass
touch "$OUT/gen2.done"
exec sleep 1000
`

// cleanRoomUndo removes what gen 1 planted in the host's /tmp, /var/tmp,
// /dev/shm and IPC namespace (in scan mode; with layers, the SysV ids are
// of gen 1's own IPC namespace and name nothing of the host's).
func cleanRoomUndo(t *testing.T, out, tok string, scan bool) {
	for _, d := range []string{"/tmp", "/var/tmp", "/dev/shm"} {
		os.Remove(filepath.Join(d, "shim-planted-"+tok))
	}
	if !scan {
		return
	}
	for kind, file := range map[string]string{"-m": "shmid", "-q": "msgid", "-s": "semid"} {
		b, err := os.ReadFile(filepath.Join(out, file))
		if id, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
			ipcrm(t, kind, id)
		}
	}
	name, _ := unix.BytePtrFromString("shim-planted-" + tok) // mq_unlink's name, without the slash
	unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(name)), 0, 0)
}

func ipcrm(t *testing.T, kind string, id int) {
	var err error
	switch kind {
	case "-m":
		_, err = unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	case "-q":
		_, _, e := unix.Syscall(unix.SYS_MSGCTL, uintptr(id), uintptr(unix.IPC_RMID), 0)
		if e != 0 {
			err = e
		}
	case "-s":
		_, _, e := unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, uintptr(unix.IPC_RMID), 0, 0, 0)
		if e != 0 {
			err = e
		}
	}
	if err != nil && err != unix.EINVAL && err != unix.EIDRM {
		t.Logf("remove SysV object %s %d: %v", kind, id, err)
	}
}

// cleanRoomVectors are what found lists when every vector crossed (and
// the .pth in the user site dir).
func cleanRoomVectors(home, tok string) []string {
	return []string{home + "/.gitconfig", home + "/.bashrc", home + "/hooks",
		"/tmp/shim-planted-" + tok, "/var/tmp/shim-planted-" + tok, "/dev/shm/shim-planted-" + tok,
		"sysv-shm", "sysv-msg", "sysv-sem", "posix-mqueue"}
}

func TestLayerCleanRoom(t *testing.T) {
	testutil.NeedTool(t, "ipcmk")
	testutil.NeedTool(t, "bash")
	for _, iso := range []string{"auto", "scan"} {
		t.Run(iso, func(t *testing.T) {
			r := newLayerRig(t, iso)
			f, s := r.f, r.s
			tok := randName("")
			t.Cleanup(func() { cleanRoomUndo(t, f.out, tok, iso == "scan") })
			g1 := script(t, f.bin, "gen1.sh", cleanRoomGen1)
			s.MustCtl(nil, f.startArgs(1, "--", g1, f.out, tok)...)
			eventually(t, 30*time.Second, "gen 1 planted everything", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "ready"))
				return err == nil
			})
			// The shared dir is shared: the test sees what gen 1 wrote there.
			if got, _ := os.ReadFile(filepath.Join(f.out, "shared-by-gen1")); string(got) != "gen1\n" {
				t.Errorf("the --persist dir is not shared with the host: %q", got)
			}

			g2 := script(t, f.bin, "gen2.sh", cleanRoomGen2)
			var r2 api.StartResult
			s.MustCtl(&r2, f.startArgs(2, "--", g2, f.out, tok)...)
			eventually(t, 60*time.Second, "gen 2 looked and ran git, bash and python", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "gen2.done"))
				return err == nil
			})
			if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil {
				t.Fatalf("fence of gen 1: %+v", r2.Fenced)
			}
			found := readLines(filepath.Join(f.out, "found"))
			marker := readLines(filepath.Join(f.out, "marker"))
			if got, _ := os.ReadFile(filepath.Join(f.out, "shared-seen")); string(got) != "gen1\n" {
				t.Errorf("gen 2 does not see what gen 1 wrote to the --persist dir: %q", got)
			}
			if iso == "scan" {
				// The control: every vector crosses, every payload runs.
				site := filepath.Join(f.home, ".local/lib")
				for _, v := range cleanRoomVectors(f.home, tok) {
					if !contains(found, v) {
						t.Errorf("scan: gen 2 does not find %s: the control does not show the vector (found %v)", v, found)
					}
				}
				if !containsPrefix(found, site) {
					t.Errorf("scan: gen 2 does not find the .pth under %s (found %v)", site, found)
				}
				for _, m := range []string{"fsmonitor", "hook", "bashrc", "pth"} {
					if !contains(marker, m) {
						t.Errorf("scan: gen 1's %s payload did not run in gen 2 (marker %v)", m, marker)
					}
				}
				return
			}
			if len(found) != 0 {
				t.Errorf("layers: gen 2 finds what gen 1 planted: %v", found)
			}
			if len(marker) != 0 {
				t.Errorf("layers: gen 1's code ran in gen 2: %v", marker)
			}
			// Nothing reached the host either, and the fence report lists
			// what gen 1 wrote outside the worktree.
			for _, d := range []string{"/tmp", "/var/tmp", "/dev/shm"} {
				if _, err := os.Lstat(filepath.Join(d, "shim-planted-"+tok)); err == nil {
					t.Errorf("layers: gen 1's file reached the host's %s", d)
				}
			}
			if _, err := os.Lstat(filepath.Join(f.home, ".gitconfig")); err == nil {
				t.Errorf("layers: gen 1's .gitconfig reached the host")
			}
			lr := r2.Fenced[0].Layer
			if lr == nil {
				t.Fatalf("layers: the fence report has no layer section: %+v", r2.Fenced[0])
			}
			for _, p := range []string{f.home + "/.gitconfig", f.home + "/.bashrc", "/tmp/shim-planted-" + tok, "/var/tmp/shim-planted-" + tok} {
				if !contains(lr.Paths, p) && !lr.PathsTruncated {
					t.Errorf("layers: the layer report does not list %s: %v", p, lr.Paths)
				}
			}
			if contains(lr.Paths, f.out+"/shared-by-gen1") {
				t.Errorf("layers: the layer report lists a file of the shared dir")
			}
			if lr.Bytes <= 0 || !lr.Kept {
				t.Errorf("layers: layer report %+v", lr)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func containsPrefix(list []string, prefix string) bool {
	for _, v := range list {
		if strings.HasPrefix(v, prefix) {
			return true
		}
	}
	return false
}

// ---- 2. the snapshot holds every byte ----

// completeGen1 commits twice, then edits every way a file can change: a
// binary file new and modified, an executable bit on a tracked file and a
// new script, symlinks (to a file, a dir, nowhere), a deletion, a file
// renamed, a tracked directory renamed, new nested dirs, a tracked dir
// removed and made again with other contents (an opaque dir of the layer),
// a file where a tracked dir was and a dir where a tracked file was, an
// empty file, names with a newline, a quote, a backslash, a byte that is
// not UTF-8.
// It copies what it ends with to $OUT/gen1-tree and its HEAD to
// $OUT/gen1.head.
const completeGen1 = `
set -e
IN=$1 OUT=$2
echo "first local commit" >> README.md
git commit -qam "gen 1: first"
echo "// second local commit" >> src/main.go
git commit -qam "gen 1: second"
git rev-parse HEAD > "$OUT/gen1.head"
cat "$IN/blob.bin" > new.bin
cat "$IN/blob2.bin" > bin.dat
printf '#!/bin/sh\necho tool\n' > tool.sh
chmod 755 tool.sh
chmod 755 src/main.go
ln -s src/main.go link-main
ln -s src link-src
ln -s /nonexistent/target dangling
rm delete-me.txt
mv README.md README.txt
mv src/lib src/library
mkdir -p new/deep/dir
cat "$IN/notes.txt" > new/deep/dir/notes.txt
rm -rf docs
mkdir docs
echo "a different file in the remade dir" > docs/other.txt
echo "a file where a tracked dir was" > src/lib
rm .gitignore
mkdir .gitignore
echo "a dir where a tracked file was" > .gitignore/inner
: > empty.txt
printf 'no newline' > "name with
newline"
printf q > 'quo"te\back slash'
printf h > "$(printf 'high\377byte')"
cp -a . "$OUT/gen1-tree"
rm -rf "$OUT/gen1-tree/.git"
touch "$OUT/ready"
exec sleep 1000
`

func TestLayerSnapshotComplete(t *testing.T) {
	r := newLayerRig(t, "auto")
	f, s := r.f, r.s
	blob := make([]byte, 300<<10)
	for i := range blob {
		blob[i] = byte(i*7 + i>>9)
	}
	writeFile(t, filepath.Join(f.in, "blob.bin"), string(blob), 0o644)
	writeFile(t, filepath.Join(f.in, "blob2.bin"), "\x00\xff\x00changed\r\n\x00\x01", 0o644)
	writeFile(t, filepath.Join(f.in, "notes.txt"), "untracked notes in a new directory\n", 0o644)
	g1 := script(t, f.bin, "gen1.sh", completeGen1)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.in, f.out)...)
	eventually(t, 30*time.Second, "gen 1 done editing", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	// The lower is never written: the host's worktree is the baseline.
	if head := hgit(t, f.wt, "rev-parse", "HEAD"); head != f.baseline {
		t.Errorf("gen 1's commit reached the lower: HEAD %s", head)
	}
	if d := diffTrees(f.baseEntries(), treeEntries(t, f.wt)); len(d) > 0 {
		t.Errorf("gen 1's edits reached the lower: %v", d)
	}
	gen1Head := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen1.head")))
	wrote := treeEntries(t, filepath.Join(f.out, "gen1-tree"))
	for p, want := range map[string]string{"link-src": "symlink -> src", "tool.sh": "exec \"#!/bin/sh\\necho tool\\n\"",
		"docs/other.txt": "file \"a different file in the remade dir\\n\""} {
		if wrote[p] != want {
			t.Fatalf("gen 1 did not write what the test means: %s is %q, want %q", p, wrote[p], want)
		}
	}
	for _, p := range []string{"docs/guide.txt", "src/lib/lib.go", "README.md", "delete-me.txt"} {
		if _, ok := wrote[p]; ok {
			t.Fatalf("gen 1 did not remove %s", p)
		}
	}

	r2, status := f.startGen2(t, s, 2)
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", status)
	}
	if d := diffTrees(f.baseEntries(), treeEntries(t, genView(t, s, 2, f.wt))); len(d) > 0 {
		t.Errorf("gen 2's worktree is not the baseline: %v", d)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil {
		t.Fatalf("fence of gen 1: %+v", r2.Fenced)
	}
	rep := r2.Fenced[0]
	w := rep.Worktree
	if w == nil || w.Isolation != "layers" || rep.SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("fence report: %+v worktree %+v", rep, w)
	}
	if w.HeadBefore != gen1Head || w.LocalCommits != 2 {
		t.Errorf("worktree report: head_before %s local_commits %d, want %s and 2", w.HeadBefore, w.LocalCommits, gen1Head)
	}
	snap := rep.SnapshotCommit
	if p := hgit(t, f.wt, "rev-parse", snap+"^1"); p != gen1Head {
		t.Errorf("the snapshot's first parent is %s, want gen 1's HEAD %s", p, gen1Head)
	}
	if n := hgit(t, f.wt, "rev-list", "--count", snap+"^@", "--not", f.baseline); n != "2" {
		t.Errorf("the snapshot's parents hold %s commits of gen 1, want 2", n)
	}
	if msgs := hgit(t, f.wt, "log", "--format=%s", snap+"^1", "--not", f.baseline); msgs != "gen 1: second\ngen 1: first" {
		t.Errorf("gen 1's commits: %q", msgs)
	}
	if len(w.NotStored) != 0 {
		t.Errorf("nothing should be left unstored: %+v", w.NotStored)
	}
	// What shim imported into the checkout's repository is the owner's:
	// the next harness adds objects to the same fan-out directories (a
	// root-owned one refused its first commit). Only the packs are
	// shim's, read-only: sealed (a harness's git cannot freshen them).
	filepath.WalkDir(filepath.Join(f.wt, ".git", "objects"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, ierr := d.Info()
		st, ok := info.Sys().(*syscall.Stat_t)
		switch {
		case ierr != nil || !ok:
		case filepath.Base(filepath.Dir(p)) == "pack" && strings.HasPrefix(d.Name(), "pack-"):
			if st.Uid != 0 || st.Mode&0o222 != 0 {
				t.Errorf("%s is not sealed: uid %d, mode %o", p, st.Uid, st.Mode&0o777)
			}
		case int(st.Uid) != wtUID:
			t.Errorf("%s is owned by uid %d, not the worktree's %d", p, st.Uid, wtUID)
		}
		return nil
	})
	if err := hgitFsck(f.wt); err != nil {
		t.Errorf("git fsck after the import: %v", err)
	}
	got := treeEntries(t, f.checkout(t, snap))
	if d := diffTrees(wrote, got); len(d) > 0 {
		t.Errorf("the snapshot checked out with plain git is not what gen 1 wrote:\n%s", strings.Join(d, "\n"))
	}
}

func hgitFsck(dir string) error {
	out, err := hgitErr(dir, "fsck", "--no-dangling", "--no-progress")
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// ---- 3. nothing the harness does to its layer wedges a fence ----

type layerWedge struct {
	name string
	body string // runs in the worktree as the harness; $1 is OUT
	// check looks at the fence of gen 1 (rep) and gen 2's view.
	check func(t *testing.T, r *layerRig, rep api.FenceReport)
}

var layerWedges = []layerWedge{
	{name: "fifo-at-tracked-path", body: `rm src/main.go && mkfifo src/main.go`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {
			layerWantNotStored(t, rep, "src/main.go", "fifo", -1)
		}},
	{name: "mode-000-file", body: `echo locked > src/main.go && chmod 000 src/main.go && echo new > new.txt && chmod 000 new.txt`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {
			layerWantBlob(t, r.f, rep, "src/main.go", "locked\n")
			layerWantBlob(t, r.f, rep, "new.txt", "new\n")
		}},
	{name: "mode-000-and-read-only-dirs", body: `mkdir -p newdir/sub && echo inside > newdir/sub/f && chmod 000 newdir/sub newdir &&
echo lib >> src/lib/lib.go && chmod 000 src/lib && chmod a-w src docs`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {
			layerWantBlob(t, r.f, rep, "newdir/sub/f", "inside\n")
			layerWantBlob(t, r.f, rep, "src/lib/lib.go", r.f.base["src/lib/lib.go"]+"lib\n")
		}},
	{name: "read-only-objects", body: `echo committed >> docs/guide.txt && git commit -qam "gen 1" && git rev-parse HEAD > "$1/gen1.head" && chmod -R a-w .git/objects .git`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {
			head := strings.TrimSpace(readString(t, filepath.Join(r.f.out, "gen1.head")))
			if rep.Worktree.HeadBefore != head {
				t.Errorf("the snapshot's head_before %s, want gen 1's commit %s", rep.Worktree.HeadBefore, head)
			}
			if p := hgit(t, r.f.wt, "rev-parse", rep.SnapshotCommit+"^1"); p != head {
				t.Errorf("the snapshot's parent %s, want gen 1's commit %s", p, head)
			}
			layerWantBlob(t, r.f, rep, "docs/guide.txt", r.f.base["docs/guide.txt"]+"committed\n")
		}},
	{name: "packed-and-a-side-branch", body: `echo one >> docs/guide.txt && git commit -qam one && git checkout -qb side &&
echo side > side.txt && git add side.txt && git commit -qm side && git checkout -q main && git gc -q --prune=now &&
git rev-parse main side > "$1/heads" && git checkout -q side && rm side.txt`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {
			heads := readLines(filepath.Join(r.f.out, "heads"))
			got := strings.Split(hgit(t, r.f.wt, "rev-parse", rep.SnapshotCommit+"^@"), "\n")
			// The branch checked out (side) first, then the other.
			if len(heads) != 2 || len(got) != 2 || got[0] != heads[1] || got[1] != heads[0] {
				t.Errorf("the snapshot's parents %v, want side then main %v", got, heads)
			}
			if rep.Worktree.HeadBefore != heads[1] {
				t.Errorf("head_before %s, want the branch checked out (side) %s", rep.Worktree.HeadBefore, heads[1])
			}
			layerWantBlob(t, r.f, rep, "docs/guide.txt", r.f.base["docs/guide.txt"]+"one\n")
		}},
	{name: "a-branch-sorting-before-HEADs", body: `echo one >> docs/guide.txt && git commit -qam one &&
side=$(echo side | git commit-tree -p HEAD "HEAD^{tree}") && git update-ref refs/heads/aaa $side &&
git rev-parse main aaa > "$1/heads"`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {
			// HEAD is the lower's (ref: refs/heads/main): main first.
			heads := readLines(filepath.Join(r.f.out, "heads"))
			got := strings.Split(hgit(t, r.f.wt, "rev-parse", rep.SnapshotCommit+"^@"), "\n")
			if len(heads) != 2 || strings.Join(got, " ") != strings.Join(heads, " ") || rep.Worktree.HeadBefore != heads[0] {
				t.Errorf("the snapshot's parents %v (head_before %s), want main then aaa %v", got, rep.Worktree.HeadBefore, heads)
			}
		}},
	{name: "git-dir-removed", body: `rm -rf .git`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {}},
	{name: "git-dir-a-file", body: `rm -rf .git && echo "gitdir: /nonexistent" > .git`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {}},
	{name: "git-dir-a-symlink", body: `mv .git ../out/moved-git && ln -s /etc .git`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {}},
	{name: "git-dir-a-fifo", body: `rm -rf .git && mkfifo .git`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {}},
	{name: "git-dir-remade", body: `rm -rf .git && git init -q -b main . && git add -A && git commit -qm "another history"`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {}},
	{name: "sparse-40GiB", body: `truncate -s 40G big.bin`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {
			layerWantNotStored(t, rep, "big.bin", "file", 40<<30)
			if _, ok := r.f.blob(t, rep.SnapshotCommit, "big.bin"); ok {
				t.Errorf("the 40 GiB file is in the snapshot")
			}
		}},
	{name: "refs", body: `echo edit >> docs/guide.txt && git commit -qam "gen 1" && c=$(git rev-parse HEAD) && echo $c > "$1/gen1.head" &&
git update-ref refs/shim/abandoned/2 $c && git update-ref refs/remotes/origin/main $c && git tag gen1-tag $c && git branch gen1-branch $c &&
mkdir -p .git/rr-cache/0123 && echo x > .git/rr-cache/0123/preimage && echo $c > .git/FETCH_HEAD && echo $c > .git/ORIG_HEAD`,
		check: func(t *testing.T, r *layerRig, rep api.FenceReport) {
			f := r.f
			refs := hgit(t, f.work, "--git-dir", genView(t, r.s, 2, f.wt+"/.git"), "for-each-ref", "--format=%(refname) %(objectname)")
			want := fmt.Sprintf("refs/heads/main %s\nrefs/remotes/origin/main %s\nrefs/shim/abandoned/1 %s", f.baseline, f.baseline, rep.SnapshotCommit)
			if refs != want {
				t.Errorf("gen 2's refs:\n%s\nwant\n%s", refs, want)
			}
			for _, p := range []string{".git/rr-cache", ".git/FETCH_HEAD", ".git/ORIG_HEAD"} {
				if _, err := os.Lstat(filepath.Join(genView(t, r.s, 2, f.wt), p)); err == nil {
					t.Errorf("gen 2 finds gen 1's %s", p)
				}
			}
		}},
}

func TestLayerWedges(t *testing.T) {
	for _, w := range layerWedges {
		t.Run(w.name, func(t *testing.T) {
			r := newLayerRig(t, "auto")
			f, s := r.f, r.s
			g1 := script(t, f.bin, "gen1.sh", "set -e\nOUT=$1\necho abandoned >> README.md\n"+w.body+"\ntouch \"$OUT/ready\"\nexec sleep 1000\n")
			s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
			eventually(t, 30*time.Second, "gen 1 wedged its worktree", func() bool {
				_, err := os.Stat(filepath.Join(f.out, "ready"))
				return err == nil
			})
			rchar := layerRchar(t, s)
			r2, status := f.startGen2(t, s, 2)
			read := layerRchar(t, s) - rchar
			if status != "" {
				t.Errorf("gen 2 found a dirty worktree:\n%s", status)
			}
			if d := diffTrees(f.baseEntries(), treeEntries(t, genView(t, s, 2, f.wt))); len(d) > 0 {
				t.Errorf("gen 2's worktree is not the baseline: %v", d)
			}
			if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil || r2.Fenced[0].Worktree == nil {
				t.Fatalf("fence of gen 1: %+v", r2.Fenced)
			}
			rep := r2.Fenced[0]
			if rep.SnapshotRef != "refs/shim/abandoned/1" || rep.Worktree.Isolation != "layers" || rep.Worktree.SnapshotReused {
				t.Errorf("fence report: %+v", rep.Worktree)
			}
			layerWantBlob(t, f, rep, "README.md", f.base["README.md"]+"abandoned\n")
			w.check(t, r, rep)
			if read > 1<<30 {
				t.Errorf("shim read %d bytes during the fence", read)
			}
			t.Logf("fence ms %v; shim read %d bytes; skipped %+v", rep.DurationsMS, read, rep.Worktree.NotStored)
			// The next fence is not wedged either, and its snapshot is its
			// own (not a ref gen 1 planted for it).
			var r3 api.StartResult
			s.MustCtl(&r3, f.startArgs(3, "--", "sleep", "1000")...)
			if len(r3.Fenced) != 1 || r3.Fenced[0].Error != nil || r3.Fenced[0].SnapshotRef != "refs/shim/abandoned/2" || r3.Fenced[0].Worktree.SnapshotReused {
				t.Fatalf("fence of gen 2: %+v", r3.Fenced)
			}
			if p := hgit(t, f.wt, "rev-parse", r3.Fenced[0].SnapshotCommit+"^@"); p != f.baseline {
				t.Errorf("gen 2's snapshot has parents %q, want the baseline", p)
			}
		})
	}
}

// layerRchar is how many bytes shim itself has read (its /proc io).
func layerRchar(t *testing.T, s *Shim) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", s.Cmd.Process.Pid))
	if err != nil {
		t.Fatalf("shim's io: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatalf("no rchar in %s", b)
	return 0
}

func layerWantBlob(t *testing.T, f *wtFixture, rep api.FenceReport, path, want string) {
	t.Helper()
	if got, ok := f.blob(t, rep.SnapshotCommit, path); !ok || got != want {
		t.Errorf("snapshot %s = %q (present %v), want %q", path, got, ok, want)
	}
}

// layerWantNotStored wants path listed as skipped with type typ (and size,
// unless it is -1).
func layerWantNotStored(t *testing.T, rep api.FenceReport, path, typ string, size int64) {
	t.Helper()
	for _, s := range rep.Worktree.NotStored {
		if s.Path == path && s.Type == typ && (size < 0 || s.Size == size) {
			return
		}
	}
	t.Errorf("the report does not list %s as not stored %s (size %d): %+v", path, typ, size, rep.Worktree.NotStored)
}

// ---- 4. a shim restart loses no abandoned edit ----

const restartGen1 = `
set -e
OUT=$1
echo "committed before the crash" >> docs/guide.txt
git commit -qam "gen 1"
git rev-parse HEAD > "$OUT/gen1.head"
echo "abandoned before the crash" >> README.md
echo new > new.txt
rm delete-me.txt
touch "$OUT/ready"
exec sleep 1000
`

func TestLayerShimRestartKeepsTheLayer(t *testing.T) {
	requireRoot(t)
	rd := t.TempDir()
	root := filepath.Join(cgroup2Mount(), randName("shim-it-"))
	t.Cleanup(func() { removeCgroupTree(t, root) })
	r := newLayerRigWith(t, layerOpts{iso: "auto", o: shimOpts{runtimeDir: rd, cgroupRoot: root}}) // the same for both shims
	f := r.f
	g1 := script(t, f.bin, "gen1.sh", restartGen1)
	var r1 api.StartResult
	r.s.MustCtl(&r1, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 30*time.Second, "gen 1 edited", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	head := strings.TrimSpace(readString(t, filepath.Join(f.out, "gen1.head")))
	// SIGKILL: shim, and with it its pid namespace and gen 1, die at once;
	// gen 1's worktree layer is left on disk.
	r.s.Stop()
	r.start(t)
	r2, status := f.startGen2(t, r.s, 2)
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", status)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Generation != 1 || r2.Fenced[0].Error != nil || r2.Fenced[0].Worktree == nil {
		t.Fatalf("the restarted shim did not fence gen 1: %+v", r2.Fenced)
	}
	rep := r2.Fenced[0]
	if rep.SnapshotRef != "refs/shim/abandoned/1" || rep.Worktree.Isolation != "layers" {
		t.Errorf("fence report: %+v", rep.Worktree)
	}
	if rep.Worktree.HeadBefore != head {
		t.Errorf("head_before %s, want gen 1's commit %s", rep.Worktree.HeadBefore, head)
	}
	layerWantBlob(t, f, rep, "README.md", f.base["README.md"]+"abandoned before the crash\n")
	layerWantBlob(t, f, rep, "new.txt", "new\n")
	layerWantBlob(t, f, rep, "docs/guide.txt", f.base["docs/guide.txt"]+"committed before the crash\n")
	if _, ok := f.blob(t, rep.SnapshotCommit, "delete-me.txt"); ok {
		t.Errorf("delete-me.txt is in the snapshot: the deletion was lost")
	}
}

// ---- 5. --require-isolation where there are no layers ----

func TestLayerRequireIsolation(t *testing.T) {
	t.Run("init flag", func(t *testing.T) {
		r := newLayerRig(t, "scan", "--require-isolation")
		out, errs, code := r.s.Ctl(r.f.startArgs(1, "--", "sleep", "1000")...)
		if code == 0 || ctlError(t, errs).Code != api.CodeIsolationUnavailable {
			t.Fatalf("start under --require-isolation without layers: exit %d %s %s", code, out, errs)
		}
		var st api.Status
		r.s.MustCtl(&st, "status")
		if st.Pid != 0 || st.State == api.StateRunning {
			t.Errorf("a generation started: %+v", st)
		}
	})
	t.Run("announcement", func(t *testing.T) {
		r := newLayerRig(t, "scan")
		f, s := r.f, r.s
		g1 := script(t, f.bin, "gen1.sh", gen1EditAndSleep)
		var r1 api.StartResult
		s.MustCtl(&r1, f.startArgs(1, "--", g1, f.out)...)
		eventually(t, 30*time.Second, "gen 1 edited", func() bool {
			_, err := os.Stat(filepath.Join(f.out, "ready"))
			return err == nil
		})
		req := api.StartRequest{Generation: 2, Command: []string{"sleep", "1000"}, Worktree: f.wt, Baseline: f.baseline,
			User: fmt.Sprintf("%d:%d", wtUID, wtUID), Env: []string{"HOME=" + f.home, "PATH=/usr/bin:/bin"}, RequireIsolation: true}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_, err := s.Client.Start(ctx, req)
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeIsolationUnavailable {
			t.Fatalf("start 2 requiring isolation: %v", err)
		}
		// The old generation is fenced all the same: dead, its edits saved.
		if _, err := os.Stat(r1.Cgroup); !os.IsNotExist(err) {
			t.Errorf("gen 1's cgroup is still there: %v", err)
		}
		if pids := atkGenProcs(s, 1); len(pids) != 0 {
			t.Errorf("gen 1 still runs: %v", pids)
		}
		if got, ok := f.blob(t, "refs/shim/abandoned/1", "gen1.txt"); !ok || got != "untracked\n" {
			t.Errorf("gen 1's edits not saved: %q %v", got, ok)
		}
		var st api.Status
		s.MustCtl(&st, "status")
		if st.Pid != 0 || st.Isolation.Mode != "scan" || st.Isolation.Reason == "" {
			t.Errorf("status: %+v", st)
		}
		var r3 api.StartResult
		s.MustCtl(&r3, f.startArgs(3, "--", "sleep", "1000")...)
		if len(r3.Fenced) != 0 {
			t.Errorf("gen 1 was fenced again: %+v", r3.Fenced)
		}
	})
}

// ---- the worktree and the shared paths under a mount that gets a fresh tmpfs ----

// A generation gets an empty /tmp, /var/tmp, /dev/shm where they are
// mounts of their own; a worktree, a --persist path or the runtime dir
// below one of them is still there, bound in (Debian 13 and Fedora mount
// a tmpfs on /tmp; Docker always has one on /dev/shm).
func TestLayerWorktreeBelowAFreshTmpfs(t *testing.T) {
	var st unix.Statfs_t
	testutil.Need(t, unix.Statfs("/dev/shm", &st) == nil && st.Type == unix.TMPFS_MAGIC, "no tmpfs on /dev/shm")
	t.Setenv("TMPDIR", "/dev/shm") // the fixture, the runtime dir and the layers
	r := newLayerRigWith(t, layerOpts{iso: "auto", shareBin: true})
	f, s := r.f, r.s
	if !strings.HasPrefix(f.wt, "/dev/shm/") || !strings.HasPrefix(s.RuntimeDir, "/dev/shm/") {
		t.Fatalf("the fixture is not below /dev/shm: %s %s", f.wt, s.RuntimeDir)
	}
	g1 := script(t, f.bin, "gen1.sh", gen1EditAndSleep)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 30*time.Second, "gen 1 edited", func() bool {
		_, err := os.Stat(filepath.Join(f.out, "ready"))
		return err == nil
	})
	r2, status := f.startGen2(t, s, 2)
	if status != "" {
		t.Errorf("gen 2 found a dirty worktree:\n%s", status)
	}
	if len(r2.Fenced) != 1 || r2.Fenced[0].Error != nil || r2.Fenced[0].Worktree == nil || r2.Fenced[0].Worktree.Isolation != "layers" {
		t.Fatalf("fence of gen 1: %+v", r2.Fenced)
	}
	layerWantBlob(t, f, r2.Fenced[0], "README.md", f.base["README.md"]+"gen 1 was here\n")
	layerWantBlob(t, f, r2.Fenced[0], "gen1.txt", "untracked\n")
	// The rest of /dev/shm is gen 2's own.
	if _, err := os.Lstat(genView(t, s, 2, f.home)); err == nil {
		t.Errorf("gen 2 sees the sandbox's /dev/shm (the fixture's HOME)")
	}
}

// ---- the root layer's bound, and the layers kept ----

// A generation that fills its root layer hits its bound (ENOSPC) and
// leaves the next one all of its own: a kept layer takes no room from the
// next generation's. With --keep-layers 1 the layers of the generation
// before the last fenced one are removed.
//
// Both ways a harness enters its cgroup: clone3 into it, and the
// placement stub (Docker's seccomp refuses clone3), which runs the layer
// stub in its own process rather than exec'ing shim a second time.
func TestLayerRootBoundAndPruning(t *testing.T) {
	for _, placement := range []string{"auto", "stub"} {
		t.Run(placement, func(t *testing.T) { layerRootBoundAndPruning(t, placement) })
	}
}

func layerRootBoundAndPruning(t *testing.T, placement string) {
	r := newLayerRig(t, "auto", "--root-layer-size", strconv.Itoa(8<<20), "--keep-layers", "1", "--placement", placement)
	f, s := r.f, r.s
	fill := `
OUT=$1
echo "gen $2" >> README.md
if dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null; then echo fit > "$OUT/fill.$2"; else echo full > "$OUT/fill.$2"; fi
touch "$OUT/ready.$2"
exec sleep 1000
`
	g := script(t, f.bin, "fill.sh", fill)
	for gen := 1; gen <= 3; gen++ {
		var rs api.StartResult
		s.MustCtl(&rs, f.startArgs(gen, "--", g, f.out, strconv.Itoa(gen))...)
		eventually(t, 30*time.Second, fmt.Sprintf("gen %d filled its root layer", gen), func() bool {
			_, err := os.Stat(filepath.Join(f.out, fmt.Sprintf("ready.%d", gen)))
			return err == nil
		})
		if got := strings.TrimSpace(readString(t, filepath.Join(f.out, fmt.Sprintf("fill.%d", gen)))); got != "full" {
			t.Errorf("gen %d wrote 64 MiB to /tmp with an 8 MiB root layer (%s)", gen, got)
		}
		if gen == 1 {
			continue
		}
		if len(rs.Fenced) != 1 || rs.Fenced[0].Layer == nil || rs.Fenced[0].Error != nil {
			t.Fatalf("fence of gen %d: %+v", gen-1, rs.Fenced)
		}
		if lr := rs.Fenced[0].Layer; lr.Bytes < 4<<20 || lr.Bytes > 8<<20 || !contains(lr.Paths, "/tmp/fill") {
			t.Errorf("gen %d's layer report: %d bytes, paths %v", gen-1, lr.Bytes, lr.Paths)
		}
		layerWantBlob(t, f, rs.Fenced[0], "README.md", f.base["README.md"]+fmt.Sprintf("gen %d\n", gen-1))
	}
	// Gen 3 runs; gen 2's layers are kept, gen 1's are gone.
	wt := filepath.Join(r.layers, "wt", layers.WorktreeKey(f.wt))
	if _, err := os.Stat(filepath.Join(wt, "2", "upper")); err != nil {
		t.Errorf("gen 2's worktree layer is not kept: %v", err)
	}
	// Pruning runs beside the next start, not before it.
	eventually(t, 30*time.Second, "gen 1's worktree layer removed (--keep-layers 1)", func() bool {
		_, err := os.Stat(filepath.Join(wt, "1"))
		return os.IsNotExist(err)
	})
	// Shim holds a generation's mount namespace (its overlays) until its
	// layers are saved, and lets it go after: it holds gen 3's only.
	eventually(t, 30*time.Second, "shim holding gen 3's mount namespace only", func() bool {
		return len(heldMountNamespaces(s.Cmd.Process.Pid)) == 1
	})
}

// heldMountNamespaces lists the mount namespaces process pid has open.
func heldMountNamespaces(pid int) []string {
	var ns []string
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(l, "mnt:[") {
			ns = append(ns, l)
		}
	}
	return ns
}

// --worktree-layer-size bounds what a generation writes in its worktree:
// a harness that tries to fill the disk through its worktree gets ENOSPC
// at the bound, its fence still saves what fit (its edit, and the part of
// the big file that fit) and reports the layer full, and the next
// generation gets an empty layer of the same bound. The control: the same
// harness with the worktree layer on the layers dir's disk (the default)
// writes all of it.
func TestLayerWorktreeBound(t *testing.T) {
	fill := `
OUT=$1
echo "gen $2" >> README.md
if dd if=/dev/zero of=big.bin bs=1M count=64 2>/dev/null; then echo fit > "$OUT/fill.$2"; else echo full > "$OUT/fill.$2"; fi
touch "$OUT/ready.$2"
exec sleep 1000
`
	for _, bound := range []bool{true, false} {
		t.Run(map[bool]string{true: "bounded", false: "control: on disk"}[bound], func(t *testing.T) {
			var extra []string
			if bound {
				extra = []string{"--worktree-layer-size", strconv.Itoa(16 << 20)}
			}
			r := newLayerRig(t, "auto", extra...)
			f, s := r.f, r.s
			if got := layerIsolation(t, s).WorktreeLayerBytes; bound && got != 16<<20 || !bound && got != 0 {
				t.Errorf("status isolation worktree_layer_bytes %d", got)
			}
			g := script(t, f.bin, "fill.sh", fill)
			var last api.StartResult
			for gen := 1; gen <= 2; gen++ {
				s.MustCtl(&last, f.startArgs(gen, "--", g, f.out, strconv.Itoa(gen))...)
				eventually(t, 30*time.Second, fmt.Sprintf("gen %d wrote", gen), func() bool {
					_, err := os.Stat(filepath.Join(f.out, fmt.Sprintf("ready.%d", gen)))
					return err == nil
				})
				want := map[bool]string{true: "full", false: "fit"}[bound]
				if got := strings.TrimSpace(readString(t, filepath.Join(f.out, fmt.Sprintf("fill.%d", gen)))); got != want {
					t.Errorf("gen %d writing 64 MiB in its worktree: %s, want %s", gen, got, want)
				}
			}
			if len(last.Fenced) != 1 || last.Fenced[0].Error != nil || last.Fenced[0].Worktree == nil {
				t.Fatalf("fence of gen 1: %+v", last.Fenced)
			}
			fr := last.Fenced[0]
			w := fr.Worktree
			if w.SnapshotError != "" {
				t.Fatalf("gen 1's layer was not saved: %s", w.SnapshotError)
			}
			layerWantBlob(t, f, fr, "README.md", f.base["README.md"]+"gen 1\n")
			size := f.blobSize(t, fr.SnapshotCommit, "big.bin")
			if bound {
				if !w.LayerFull || w.LayerLimitBytes != 16<<20 || w.LayerBytes > w.LayerLimitBytes || w.LayerBytes < 8<<20 {
					t.Errorf("the fence report's layer: full %v, %d of %d bytes", w.LayerFull, w.LayerBytes, w.LayerLimitBytes)
				}
				if size <= 0 || size > 16<<20 {
					t.Errorf("the snapshot's big.bin has %d bytes: want what fit in 16 MiB", size)
				}
			} else {
				if w.LayerFull || w.LayerLimitBytes != 0 {
					t.Errorf("an unbounded layer reported as bounded: %+v", w)
				}
				if size != 64<<20 {
					t.Errorf("the snapshot's big.bin has %d bytes, want 64 MiB", size)
				}
			}
		})
	}
}

// A harness's `git commit` that writes again an object a pack of the
// lower has (its trees, when its index has none cached) freshens that
// pack: git sets its times, and the overlay copies the whole pack up into
// the layer, which then costs the pack's size and the commit the copy.
// shim seals the lower's packs (root's, read-only) before the first
// layered generation and after every fence, so git writes those objects
// loose instead. The control: gen 2 runs with the lower's packs given
// back to the owner (as a clone leaves them) before it commits, and its
// layer holds a copy of the pack; gen 3, sealed again, holds none.
func TestLayerHarnessCommitCopiesNoPackUp(t *testing.T) {
	r := newLayerRig(t, "auto", "--keep-layers", "3")
	f, s := r.f, r.s
	hgit(t, f.wt, "repack", "-adq")
	packDir := filepath.Join(f.wt, ".git", "objects", "pack")
	commit := `
OUT=$1
until [ -e "$OUT/go.$2" ]; do sleep 0.05; done
echo "gen $2" >> README.md
git commit -qam "gen $2" 2> "$OUT/commit.$2"
touch "$OUT/done.$2"
exec sleep 1000
`
	g := script(t, f.bin, "commit.sh", commit)
	copies := func(gen int) []string {
		up := filepath.Join(r.layers, "wt", layers.WorktreeKey(f.wt), strconv.Itoa(gen), "upper", ".git", "objects", "pack")
		names, _ := filepath.Glob(filepath.Join(up, "pack-*.pack"))
		return names
	}
	for gen := 1; gen <= 4; gen++ {
		var rs api.StartResult
		s.MustCtl(&rs, f.startArgs(gen, "--", g, f.out, strconv.Itoa(gen))...)
		if gen > 1 {
			if len(rs.Fenced) != 1 || rs.Fenced[0].Error != nil {
				t.Fatalf("fence of gen %d: %+v", gen-1, rs.Fenced)
			}
			layerWantBlob(t, f, rs.Fenced[0], "README.md", f.base["README.md"]+fmt.Sprintf("gen %d\n", gen-1))
			switch c := copies(gen - 1); {
			case gen-1 == 2 && len(c) == 0:
				t.Fatal("control: gen 2, its packs the owner's, copied no pack into its layer; the test shows nothing")
			case gen-1 != 2 && len(c) != 0:
				t.Errorf("gen %d copied the lower's packs into its layer: %v", gen-1, c)
			}
		}
		if gen == 4 {
			break
		}
		if gen == 2 { // the control: the packs as a clone leaves them
			packs, _ := filepath.Glob(filepath.Join(packDir, "pack-*"))
			for _, p := range packs {
				if err := os.Lchown(p, wtUID, wtUID); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := os.WriteFile(filepath.Join(f.out, fmt.Sprintf("go.%d", gen)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, fmt.Sprintf("gen %d committed", gen), func() bool {
			_, err := os.Stat(filepath.Join(f.out, fmt.Sprintf("done.%d", gen)))
			return err == nil
		})
		if b := readString(t, filepath.Join(f.out, fmt.Sprintf("commit.%d", gen))); b != "" {
			t.Fatalf("gen %d's commit: %s", gen, b)
		}
	}
}

// A layered start begins its stub beside the fence (in the new
// generation's cgroup, on its layers). A fence that fails after the
// freeze, here its restore (a baseline that does not resolve), must leave
// nothing of that early start: no cgroup, no stub, no layers; and the next
// announcement still starts from a clean state.
func TestLayerFailedFenceLeavesNoEarlyStart(t *testing.T) {
	r := newLayerRig(t, "auto")
	f, s := r.f, r.s
	s.MustCtl(nil, f.startArgs(1, "--", "sleep", "1000")...)
	args := f.startArgs(2, "--", "sleep", "1000")
	for i, a := range args {
		if a == "--baseline" {
			args[i+1] = "refs/heads/no-such-branch"
		}
	}
	if _, errs, code := s.Ctl(args...); code != 4 || !strings.Contains(errs, api.CodeRestoreFailed) {
		t.Fatalf("gen 2 over a baseline that does not resolve: exit %d: %s", code, errs)
	}
	if _, err := os.Stat(filepath.Join(s.CgroupRoot, "gen-2")); !os.IsNotExist(err) {
		t.Errorf("gen 2's cgroup is left after its fence failed: %v", err)
	}
	eventually(t, 10*time.Second, "only shim left in its pid namespace (no stub of gen 2)", func() bool { return len(s.PidnsProcs()) == 1 })
	for _, d := range []string{filepath.Join(r.layers, "root", "2"), filepath.Join(r.layers, "wt", layers.WorktreeKey(f.wt), "2")} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("gen 2's layer %s is left after its fence failed: %v", d, err)
		}
	}
	var rs api.StartResult
	s.MustCtl(&rs, f.startArgs(3, "--", "sleep", "1000")...)
	if len(rs.Fenced) != 1 || rs.Fenced[0].Generation != 1 || rs.Fenced[0].Error != nil {
		t.Fatalf("gen 3's fence: %+v", rs.Fenced)
	}
}
