package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shimdev/shim/api"
)

// A fenceBox is one checkout of n files and the shim (layers mode) whose
// generations work in it, with the floor's rig beside it.
type fenceBox struct {
	n        int
	bin      string // the shim binary; "" is this one
	dir      string // the temporary dir of everything below
	wt, out  string // the checkout; the harness's ready marks (--persist)
	base     string // the baseline commit
	ls       *localShim
	floor    *floorRig
	gen      uint64
	changed  int   // what the running generation changed
	idleKB   int   // shim's RSS before its first generation
	idleAnon int   // its RssAnon then (KiB)
	idleFile int   // its RssFile then (KiB)
	rotation []int // the counts of changed files of this box's cases, in the run's order
}

// benchHarness edits the files it is given (the same bytes at every
// round: a retried step redoing its edit), commits them as a harness's
// git does (plumbing: no walk of the checkout), marks itself ready and
// waits for its fence.
const benchHarness = `set -e
G=$1 OUT=$2; shift 2
for p in "$@"; do printf 'edited %s\n' "$p" > "$p"; done
git update-index -- "$@"
t=$(git write-tree)
c=$(echo "generation $G" | git commit-tree "$t" -p HEAD)
git update-ref HEAD "$c"
: > "$OUT/ready-$G"
exec sleep 1000000
`

func newFenceBox(n int, bin string) (*fenceBox, error) {
	dir, err := os.MkdirTemp("", "shim-bench-fence-")
	if err != nil {
		return nil, err
	}
	b := &fenceBox{n: n, bin: bin, dir: dir, wt: filepath.Join(dir, "wt"), out: filepath.Join(dir, "out")}
	if err := b.build(); err != nil {
		b.close()
		return nil, err
	}
	b.ls, err = startShimBin(bin, "bench-fence", io.Discard, "--log-level", "warn", "--isolation", "auto", "--persist", b.out)
	if err != nil {
		b.close()
		return nil, err
	}
	if b.idleKB, err = statusKB(b.ls.cmd.Process.Pid, "VmRSS:"); err != nil {
		b.close()
		return nil, err
	}
	b.idleAnon, _ = statusKB(b.ls.cmd.Process.Pid, "RssAnon:")
	b.idleFile, _ = statusKB(b.ls.cmd.Process.Pid, "RssFile:")
	if b.floor, err = newFloorRig(b.wt, filepath.Join(dir, "floor"), n); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *fenceBox) close() {
	if b.floor != nil {
		b.floor.close()
	}
	if b.ls != nil {
		b.ls.close()
	}
	os.RemoveAll(b.dir)
}

// name is the box's shim binary as the table shows it.
func (b *fenceBox) name() string {
	if b.bin == "" {
		return "this"
	}
	return filepath.Base(b.bin)
}

// benchPath is the checkout's file i: 500 files a top directory, 50 a
// subdirectory (as internal/gitguard's layer benchmark).
func benchPath(i int) string {
	return fmt.Sprintf("d%03d/s%02d/f%05d.txt", i/500, (i/50)%10, i)
}

// build makes the checkout: one commit of n files written by
// fast-import, checked out, owned by the harness's uid.
func (b *fenceBox) build() error {
	if err := os.Chmod(b.dir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{b.wt, b.out} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if _, err := benchGit(b.wt, nil, "init", "-q", "-b", "main"); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() {
		w := bufio.NewWriter(pw)
		fmt.Fprintf(w, "commit refs/heads/main\ncommitter bench <bench@example.invalid> 1700000000 +0000\ndata 8\nbaseline\n")
		for i := 0; i < b.n; i++ {
			c := fmt.Sprintf("file %d\n", i)
			fmt.Fprintf(w, "M 100644 inline %s\ndata %d\n%s\n", benchPath(i), len(c), c)
		}
		fmt.Fprintf(w, "done\n")
		pw.CloseWithError(w.Flush())
	}()
	if _, err := benchGit(b.wt, pr, "fast-import", "--quiet", "--done"); err != nil {
		return err
	}
	if _, err := benchGit(b.wt, nil, "reset", "-q", "--hard", "main"); err != nil {
		return err
	}
	base, err := benchGit(b.wt, nil, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	b.base = strings.TrimSpace(base)
	for _, d := range []string{b.wt, b.out} {
		if err := chownTree(d, benchUID); err != nil {
			return err
		}
	}
	return nil
}

// benchGit runs the benchmark's own git on the checkout it built, before
// any harness ran there (no system or global config).
func benchGit(dir string, stdin io.Reader, args ...string) (string, error) {
	//shimlint:allow hardgit: the benchmark builds its own checkout, before any harness runs there
	cmd := exec.Command("git", append([]string{"-c", "core.hooksPath=/dev/null", "-c", "safe.directory=*"}, args...)...)
	cmd.Dir, cmd.Stdin = dir, stdin
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + dir, "LC_ALL=C", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
	//shimlint:allow onereaper: shim bench runs as a command, not as PID 1
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func chownTree(root string, uid int) error {
	return filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
}

// request is generation gen's announcement: the harness changes changed
// files spread over the tree.
func (b *fenceBox) request(gen uint64, changed int) api.StartRequest {
	cmd := []string{"sh", "-c", benchHarness, "sh", strconv.FormatUint(gen, 10), b.out}
	for k := 0; k < changed; k++ {
		cmd = append(cmd, benchPath(k*b.n/changed))
	}
	u := strconv.Itoa(benchUID)
	return api.StartRequest{Generation: gen, Command: cmd, Cwd: b.wt, Worktree: b.wt, Baseline: b.base,
		User: u + ":" + u, RequireIsolation: true,
		Env: []string{"HOME=" + b.out, "PATH=/usr/bin:/bin", "GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@example.invalid",
			"GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@example.invalid"}}
}

// next is the count of changed files of the case after changed in this
// box's rotation: what the generation an announcement starts changes.
func (b *fenceBox) next(changed int) int {
	for i, c := range b.rotation {
		if c == changed {
			return b.rotation[(i+1)%len(b.rotation)]
		}
	}
	return changed
}
