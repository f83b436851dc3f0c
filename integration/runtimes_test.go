package integration

// The runtime matrix (issue 26, item 4): the sandbox image and the seed
// scenario under every container runtime this machine has: Docker with
// runc (the baseline), podman rootful with crun (its default) and with
// runc, podman rootless (a test user with subuids) and gVisor (runsc,
// through podman --runtime). Each case writes one markdown row (what
// `shim ctl status` says: mode, mode_reason, isolation; which guarantees
// held) into $SHIM_MATRIX_OUT (else the test's temp dir) and logs it;
// scripts/matrix runs them and prints the table that images/README.md
// carries.
//
// Every container runs with --network none: the git server is the
// container's own (git daemon on 127.0.0.1, shim's service), so nothing
// leaves the container's network namespace (runsc would otherwise take
// over the interfaces of the namespace it is given).
//
// A runtime that is installed but cannot start a container here is a row
// that says why, and the case passes only when the reason is the known one
// (wantFail); any other failure fails it.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// matrixRootlessUser is the user rootless podman runs as (scripts/deps
// creates it with subordinate ids).
func matrixRootlessUser() string {
	if u := os.Getenv("SHIM_ROOTLESS_USER"); u != "" {
		return u
	}
	return "shimmatrix"
}

// crunHybrid is crun 1.8's refusal on a hybrid cgroup host whose cgroup2
// hierarchy has controllers enabled (this machine: hugetlb).
const crunHybrid = "cgroups in hybrid mode not supported"

// matrixCase is one runtime of the matrix.
type matrixCase struct {
	name     string   // the row's first cell
	tool     string   // "docker" or "podman"
	runtime  string   // podman --runtime
	rootless bool     // podman as matrixRootlessUser
	global   []string // podman flags before the subcommand
	// wantFail: the known reason this runtime cannot start a container
	// here; "" when it must run the scenario.
	wantFail func() string
	// wantReason must be in status's mode_reason: what shim says of the
	// runtime, and what would give cgroup2.
	wantReason string
	// wantWeak are the codes status's weakened list must hold (exactly):
	// the guarantees shim gives only in part under this runtime.
	wantWeak []string
	// execGetsCaps: the runtime gives a process started by `exec -u
	// 1000` the container's capabilities (runsc), so shim answers it;
	// the harness itself must still be refused.
	execGetsCaps bool
}

func matrixCases() []matrixCase {
	return []matrixCase{
		{name: "Docker, runc", tool: "docker", wantReason: "shim mounted cgroup2"},
		{name: "podman rootful, runc", tool: "podman", runtime: "runc", wantReason: "shim mounted cgroup2"},
		{name: "podman rootful, crun (default)", tool: "podman", runtime: "crun", wantFail: crunHybridReason},
		{name: "podman rootful, gVisor (runsc)", tool: "podman", runtime: "runsc", global: []string{"--runtime-flag", "network=none"},
			wantReason: "under gVisor SO_PEERCRED may report shim's own credentials", execGetsCaps: true,
			wantWeak: []string{api.WeakOwnerGitPtraceScope, api.WeakPeerCredUnreliable}},
		{name: "podman rootless, runc", tool: "podman", runtime: "runc", rootless: true, wantReason: "in a user namespace (rootless)"},
		{name: "podman rootless, crun", tool: "podman", runtime: "crun", rootless: true, wantFail: crunHybridReason},
	}
}

// crunHybridReason is crunHybrid when this host is hybrid with controllers
// in its cgroup2 hierarchy, else "" (crun must then run).
func crunHybridReason() string {
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err != nil {
		return ""
	}
	data, _ := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
	if strings.TrimSpace(string(data)) == "" {
		return ""
	}
	return crunHybrid
}

// matrixWhy says why the matrix cannot run ("" when it can).
func matrixWhy(c matrixCase) string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	if _, err := exec.LookPath(c.tool); err != nil {
		return "no " + c.tool
	}
	if c.runtime != "" {
		if _, err := exec.LookPath(c.runtime); err != nil {
			return "no " + c.runtime
		}
	}
	if c.rootless {
		if _, err := user.Lookup(matrixRootlessUser()); err != nil {
			return "no user " + matrixRootlessUser() + " (scripts/deps creates it)"
		}
		if _, err := exec.LookPath("newuidmap"); err != nil {
			return "no newuidmap (uidmap)"
		}
	}
	return ""
}

// matrixEngine runs one tool (docker, podman as root or as the rootless
// user) and holds the image it loaded.
type matrixEngine struct {
	c   matrixCase
	img string
	env []string // for rootless podman
	uid int
	gid int
	dir string // rootless: HOME, XDG_RUNTIME_DIR, storage
	// cgroupParent (rootful podman): the cgroup, of this test's own, its
	// containers and their conmons go under (podman's default,
	// /libpod_parent, is shared and podman leaves it behind).
	cgroupParent string
}

// podmanCgroupParent gives rootful podman's containers a cgroup parent of
// the test's own and removes it, in every hierarchy, once the test's
// containers are gone (registered before them: cleanups run last first).
func (e *matrixEngine) podmanCgroupParent(t *testing.T) {
	e.cgroupParent = "/" + randName("shim-podman-")
	t.Cleanup(func() { removeCgroupEverywhere(t, e.cgroupParent) })
}

// removeCgroupEverywhere removes the cgroup named rel (a test's own) from
// every hierarchy mounted under /sys/fs/cgroup (v1 controllers, the
// hybrid host's unified one, or a pure cgroup2 host's root).
func removeCgroupEverywhere(t *testing.T, rel string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", rel))
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", rel)); err == nil {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", rel))
	}
	for _, d := range dirs {
		removeCgroupTree(t, d)
	}
}

func (e *matrixEngine) cmd(stdin string, args ...string) (string, string, int) {
	var full []string
	if e.c.tool == "podman" {
		if e.c.rootless {
			full = append(full, "--root", filepath.Join(e.dir, "storage"), "--runroot", filepath.Join(e.dir, "runroot"))
		}
		if e.c.runtime != "" {
			full = append(full, "--runtime", e.c.runtime)
		}
		full = append(full, e.c.global...)
	}
	full = append(full, args...)
	cmd := exec.Command(e.c.tool, full...)
	if e.c.rootless {
		cmd.Env = e.env
		cmd.Dir = e.dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(e.uid), Gid: uint32(e.gid)}}
	}
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
		errb.WriteString(err.Error())
	}
	return out.String(), errb.String(), code
}

// newMatrixEngine gets the sandbox image into the case's tool: Docker's is
// images/build.sh's; podman loads a uniquely tagged copy of it
// (docker save | podman load, no registry), removed at cleanup.
func newMatrixEngine(t *testing.T, c matrixCase) *matrixEngine {
	img := dockerImage(t)
	e := &matrixEngine{c: c, img: img}
	if c.tool == "docker" {
		return e
	}
	if c.rootless {
		e.setupRootless(t)
	} else {
		e.podmanCgroupParent(t)
	}
	tag := randName("shim-matrix-") + ":dev"
	dockerMust(t, "tag", img, tag)
	defer dockerCmd("", "rmi", tag) // the tag only; the image is the suite's
	save := exec.Command("docker", "save", tag)
	pipe, err := save.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := save.Start(); err != nil {
		t.Fatal(err)
	}
	data, errs, code := e.loadFrom(pipe)
	if err := save.Wait(); err != nil || code != 0 {
		t.Fatalf("docker save %s | podman load: %v, exit %d: %s%s", tag, err, code, data, errs)
	}
	e.img = "localhost/" + tag
	t.Cleanup(func() { e.cmd("", "rmi", "-f", e.img) })
	return e
}

// loadFrom runs podman load with r as its stdin.
func (e *matrixEngine) loadFrom(r interface{ Read([]byte) (int, error) }) (string, string, int) {
	var full []string
	if e.c.rootless {
		full = append(full, "--root", filepath.Join(e.dir, "storage"), "--runroot", filepath.Join(e.dir, "runroot"))
	}
	cmd := exec.Command("podman", append(full, "load")...)
	cmd.Stdin = r
	if e.c.rootless {
		cmd.Env, cmd.Dir = e.env, e.dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(e.uid), Gid: uint32(e.gid)}}
	}
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		code = -1
		errb.WriteString(err.Error())
	}
	return out.String(), errb.String(), code
}

// setupRootless gives the rootless user a storage, runroot, HOME and
// XDG_RUNTIME_DIR of this test's own (so copies of the suite side by side
// never share podman's database), and at cleanup ends the pause process
// podman started for it and removes the lot.
func (e *matrixEngine) setupRootless(t *testing.T) {
	u, err := user.Lookup(matrixRootlessUser())
	if err != nil {
		t.Fatal(err)
	}
	e.uid, _ = strconv.Atoi(u.Uid)
	e.gid, _ = strconv.Atoi(u.Gid)
	e.dir, err = os.MkdirTemp("", "shim-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"", "home", "xdg"} {
		p := filepath.Join(e.dir, d)
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, e.uid, e.gid); err != nil {
			t.Fatal(err)
		}
	}
	e.env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + filepath.Join(e.dir, "home"), "XDG_RUNTIME_DIR=" + filepath.Join(e.dir, "xdg"), "USER=" + u.Username}
	t.Cleanup(func() {
		// podman's rootless pause process holds its user namespace: ours.
		if data, err := os.ReadFile(filepath.Join(e.dir, "xdg", "libpod", "tmp", "pause.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if err := os.RemoveAll(e.dir); err != nil {
			t.Errorf("remove %s: %v", e.dir, err)
		}
	})
}

// matrixBox is one sandbox container of a matrix case.
type matrixBox struct {
	t    *testing.T
	e    *matrixEngine
	Name string
}

// matrixService is shim's service in the container: a git server on the
// container's loopback (git daemon, receive-pack on) over a bare
// repository seeded with one commit. As shim's service it is never swept
// (a pidns sweep spares the service and what it runs: until 2026-12-03
// only its pid, which is why it execs git-daemon itself rather than
// through "git daemon").
const matrixService = `set -e
mkdir -p /srv/git /srv/seed
git init -q --bare -b main /srv/git/repo.git
cd /srv/seed && git init -q -b main && printf 'baseline\n' > tracked.txt && printf '*.tmp\n' > .gitignore
git add -A && git -c user.name=seed -c user.email=seed@example.com commit -qm seed
git push -q /srv/git/repo.git main
exec /usr/lib/git-core/git-daemon --reuseaddr --listen=127.0.0.1 --port=9418 --base-path=/srv/git --export-all --enable=receive-pack
`

// matrixRun starts the sandbox container; it returns the box, or the
// runtime's error output when it could not start.
func matrixRun(t *testing.T, e *matrixEngine, layersDir string) (*matrixBox, string) {
	b := &matrixBox{t: t, e: e, Name: randName("shim-mx-")}
	t.Cleanup(func() {
		if t.Failed() {
			out, errs, _ := e.cmd("", "logs", "--tail", "40", b.Name)
			t.Logf("%s logs %s:\n%s%s", e.c.tool, b.Name, out, errs)
		}
		e.cmd("", "rm", "-f", "-v", b.Name) // -v: the image's VOLUME /run/shim is anonymous here
	})
	args := []string{"run", "-d", "--name", b.Name, "--network", "none", "--stop-timeout", "5",
		"--cgroupns=private", "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN"}
	if e.c.tool == "podman" {
		args = append(args, matrixUlimits()...)
	}
	if e.cgroupParent != "" {
		args = append(args, "--cgroup-parent", e.cgroupParent)
	}
	if layersDir != "" {
		args = append(args, "-v", layersDir+":/var/lib/shim")
	}
	args = append(args, e.img, "--log-level", "info", "--grace", "2s", "--isolation", "auto", "--", "sh", "-c", matrixService)
	if out, errs, code := e.cmd("", args...); code != 0 {
		return nil, strings.TrimSpace(out + errs)
	}
	// No exec before shim chose its mode: an exec's runtime process
	// joins the container's cgroup and shim would refuse it as its root.
	eventually(t, 60*time.Second, "shim's fencing mode logged", func() bool {
		out, errs, _ := e.cmd("", "logs", b.Name)
		return strings.Contains(out+errs, "fencing mode:")
	})
	return b, ""
}

// matrixUlimits are podman's rlimits for the container: its defaults
// (nofile 1048576) are above this machine's hard limits, and raising a
// hard limit needs CAP_SYS_RESOURCE, which root here lacks.
func matrixUlimits() []string {
	var nofile syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile)
	return []string{"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile.Max, nofile.Max), "--ulimit", "nproc=32768:32768"}
}

func (b *matrixBox) Exec(user string, cmd ...string) (string, string, int) {
	args := []string{"exec"}
	if user != "" {
		args = append(args, "-u", user)
	}
	return b.e.cmd("", append(append(args, b.Name), cmd...)...)
}

func (b *matrixBox) MustExec(user string, cmd ...string) string {
	b.t.Helper()
	out, errs, code := b.Exec(user, cmd...)
	if code != 0 {
		b.t.Fatalf("%s exec %s %s: exit %d: %s%s", b.e.c.tool, b.Name, strings.Join(cmd, " "), code, out, errs)
	}
	return out
}

// ctl runs `shim ctl` in the container as root: how a supervisor drives
// shim across any runtime (gVisor's unix sockets do not cross a bind mount).
func (b *matrixBox) ctl(v any, args ...string) {
	b.t.Helper()
	out := b.MustExec("", append([]string{"shim", "ctl"}, args...)...)
	if v != nil {
		if err := json.Unmarshal([]byte(out), v); err != nil {
			b.t.Fatalf("ctl %s: bad JSON %q: %v", strings.Join(args, " "), out, err)
		}
	}
}

var matrixOutMu sync.Mutex

// matrixRecord writes the row into the matrix file and logs it.
func matrixRecord(t *testing.T, row string) {
	t.Logf("matrix row: %s", row)
	out := os.Getenv("SHIM_MATRIX_OUT")
	if out == "" {
		out = filepath.Join(t.TempDir(), "matrix.md")
	}
	matrixOutMu.Lock()
	defer matrixOutMu.Unlock()
	f, err := os.OpenFile(out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("matrix file: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintln(f, row)
}

func mdCell(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ") }

func TestRuntimeMatrix(t *testing.T) {
	for _, c := range matrixCases() {
		t.Run(strings.NewReplacer(" ", "_", ",", "").Replace(c.name), func(t *testing.T) {
			if why := matrixWhy(c); why != "" {
				if os.Getenv("SHIM_REQUIRE_INTEGRATION") == "1" {
					t.Fatalf("%s cannot run (%s) but SHIM_REQUIRE_INTEGRATION=1", c.name, why)
				}
				t.Skip(why)
			}
			matrixOne(t, c)
		})
	}
}

func matrixOne(t *testing.T, c matrixCase) {
	e := newMatrixEngine(t, c)
	layers, err := os.MkdirTemp("", "shim-mx-layers-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(layers) })
	// shim's gits run as the worktree's owner and must pass the layers dir
	if err := os.Chmod(layers, 0o755); err != nil {
		t.Fatal(err)
	}
	if c.rootless {
		os.Chown(layers, e.uid, e.gid) // the container's root is the user
	}
	b, startErr := matrixRun(t, e, layers)
	want := ""
	if c.wantFail != nil {
		want = c.wantFail()
	}
	switch {
	case b == nil && want != "" && strings.Contains(startErr, want):
		matrixRecord(t, fmt.Sprintf("| %s | – | – | cannot start a container here: `%s` | – |", c.name, mdCell(lastLine(startErr))))
		return
	case b == nil:
		t.Fatalf("%s: the container did not start: %s", c.name, startErr)
	case want != "":
		t.Fatalf("%s started although %q was expected", c.name, want)
	}
	res := matrixSeed(t, b)
	matrixRecord(t, res.row(c.name))
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimPrefix(l[len(l)-1], "Error: ")
}

// matrixResult is what the seed scenario found under one runtime.
type matrixResult struct {
	st        api.Status
	survivors int
	killed    int
	saved     bool // refs/shim/abandoned/1 holds gen 1's tracked and untracked edits
	noPush    bool // gen 1's branch did not move after the fence; gen 2 pushed
	refused   bool // the control socket refused the harness (uid 1000, from inside its generation too)
	clean     bool // gen 2 found the worktree at the baseline, clean
	fenceMS   float64
	// execAnswered: `exec -u 1000 shim ctl status` was answered (runsc's
	// exec gives the process capabilities); the harness itself is refused.
	execAnswered bool
}

func execNote(answered bool) string {
	if answered {
		return " (but `exec -u 1000 shim ctl` is answered: runsc gives an exec'd process the container's capabilities whatever its uid, which pass the socket's 0600, and its SO_PEERCRED reports the listener's own pid 1, uid 0 for every peer)"
	}
	return ""
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// weakNote names status's weakened codes, "" when every guarantee holds.
func weakNote(w []api.Weakness) string {
	if len(w) == 0 {
		return ""
	}
	var codes []string
	for _, x := range w {
		codes = append(codes, "`"+x.Code+"`")
	}
	return "; weakened (status): " + strings.Join(codes, ", ")
}

func (r matrixResult) row(name string) string {
	iso := r.st.Isolation.Mode
	if r.st.Isolation.Reason != "" {
		iso += ": " + r.st.Isolation.Reason
	}
	return fmt.Sprintf("| %s | `%s`: %s | `%s` | 0 survivors: %s (killed %d); edits saved: %s; no push after the fence: %s; socket refuses the harness: %s%s; gen 2 clean: %s%s | %.0f ms |",
		name, r.st.Mode, mdCell(r.st.ModeReason), mdCell(iso), yes(r.survivors == 0), r.killed,
		yes(r.saved), yes(r.noPush), yes(r.refused), execNote(r.execAnswered), yes(r.clean), weakNote(r.st.Weakened), r.fenceMS)
}
