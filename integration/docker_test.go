package integration

// Docker integration: the sandbox image (images/) with shim as PID 1 of a
// container, driven from the host through the bind-mounted runtime dir and
// through `docker exec`. The tests run when a Docker engine answers
// (`docker info`) and the test runs as root (shim.sock is 0600 root); they
// skip otherwise, unless SHIM_REQUIRE_DOCKER=1, which makes them fail.
//
// Network: containers use --network host, so the git server the test runs
// on 127.0.0.1 is reachable from them; nothing else is contacted.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/layers"
)

// dockerFullFlags give full fencing on this kind of host: shim mounts
// cgroup2 of its private cgroup namespace itself (CAP_SYS_ADMIN), and
// creates per-generation networks (CAP_NET_ADMIN).
var dockerFullFlags = []string{"--cgroupns=private", "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN"}

var (
	dockerOnce  sync.Once
	dockerWhy   string // why Docker tests cannot run; "" when they can
	dockerImg   string
	dockerBuild string // build output, for a failure message
)

// dockerImage returns the sandbox image, built once per test binary run with
// images/build.sh (idempotent, fast when cached). It skips the test when no
// Docker engine answers or the test is not root, or fails it when
// SHIM_REQUIRE_DOCKER=1.
func dockerImage(t testing.TB) string {
	t.Helper()
	dockerOnce.Do(func() {
		if os.Geteuid() != 0 {
			dockerWhy = "needs root (shim.sock in the bind-mounted runtime dir is 0600 root)"
			return
		}
		if _, err := exec.LookPath("docker"); err != nil {
			dockerWhy = "no docker CLI"
			return
		}
		if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
			dockerWhy = fmt.Sprintf("no Docker engine (docker info: %v: %s)", err, bytes.TrimSpace(out))
			return
		}
		dockerImg = os.Getenv("SHIM_IMAGE_TAG")
		if dockerImg == "" {
			// One tag per checkout: a suite of another checkout running
			// beside this one (other code) rebuilds its own image, never
			// this one's between its build and its tests.
			repo, _ := filepath.Abs("..")
			sum := sha256.Sum256([]byte(repo))
			dockerImg = "shim-sandbox:dev-" + hex.EncodeToString(sum[:4])
		}
		cmd := exec.Command("../images/build.sh", "--tag", dockerImg)
		out, err := cmd.CombinedOutput()
		dockerBuild = string(out)
		if err != nil {
			dockerWhy = fmt.Sprintf("images/build.sh failed: %v", err)
		}
	})
	if dockerWhy != "" {
		if os.Getenv("SHIM_REQUIRE_DOCKER") == "1" {
			t.Fatalf("Docker test cannot run (%s) but SHIM_REQUIRE_DOCKER=1\n%s", dockerWhy, dockerBuild)
		}
		t.Skip(dockerWhy)
	}
	return dockerImg
}

// dockerCmd runs the docker CLI and returns stdout, stderr and exit code.
func dockerCmd(stdin string, args ...string) (string, string, int) {
	cmd := exec.Command("docker", args...)
	var out, errb bytes.Buffer
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
	}
	return out.String(), errb.String(), code
}

func dockerMust(t testing.TB, args ...string) string {
	t.Helper()
	out, errs, code := dockerCmd("", args...)
	if code != 0 {
		t.Fatalf("docker %s: exit %d: %s%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// dockerBox is one sandbox container with shim as PID 1.
type dockerBox struct {
	t          testing.TB
	Name       string
	RuntimeDir string // host side of the bind-mounted /run/shim
}

// dockerRun starts a container from the image with the given docker run
// flags (plus --network host and the runtime dir bind mount) and shim init
// flags, and waits until shim answers on the bind-mounted socket. The
// container is removed at cleanup.
func dockerRun(t testing.TB, flags []string, initArgs ...string) *dockerBox {
	t.Helper()
	img := dockerImage(t)
	b := &dockerBox{t: t, Name: randName("shim-it-"), RuntimeDir: t.TempDir()}
	t.Cleanup(func() {
		if t.Failed() {
			out, errs, _ := dockerCmd("", "logs", "--tail", "60", b.Name)
			t.Logf("docker logs %s:\n%s%s", b.Name, out, errs)
		}
		dockerCmd("", "rm", "-f", b.Name)
	})
	args := append([]string{"run", "-d", "--name", b.Name, "--network", "host", "--stop-timeout", "20",
		"-v", b.RuntimeDir + ":/run/shim"}, flags...)
	args = append(append(args, img, "--log-level", "debug"), initArgs...)
	dockerMust(t, args...)
	b.waitReady(t)
	return b
}

func (b *dockerBox) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, code := runCtl(b.RuntimeDir, "status")
		if code == 0 {
			return
		}
		if st, _, _ := dockerCmd("", "inspect", "-f", "{{.State.Running}}", b.Name); strings.TrimSpace(st) == "false" {
			logs, errs, _ := dockerCmd("", "logs", b.Name)
			t.Fatalf("container %s exited at start:\n%s%s", b.Name, logs, errs)
		}
		if time.Now().After(deadline) {
			t.Fatalf("shim in %s not ready (ctl status exit %d)", b.Name, code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Exec runs a command in the container (as user, "" = root).
func (b *dockerBox) Exec(user string, cmd ...string) (string, string, int) {
	args := []string{"exec"}
	if user != "" {
		args = append(args, "-u", user)
	}
	return dockerCmd("", append(append(args, b.Name), cmd...)...)
}

func (b *dockerBox) MustExec(user string, cmd ...string) string {
	b.t.Helper()
	out, errs, code := b.Exec(user, cmd...)
	if code != 0 {
		b.t.Fatalf("docker exec %s %s: exit %d: %s%s", b.Name, strings.Join(cmd, " "), code, out, errs)
	}
	return out
}

// dockerCtl is how a supervisor reaches shim: through the bind-mounted
// socket with ctl on the host, or `docker exec NAME shim ctl` inside.
type dockerCtl struct {
	name string
	run  func(args ...string) (string, string, int)
	// credFile puts a credential file where this ctl reads it.
	credFile func(t testing.TB, content string) string
}

func (b *dockerBox) hostCtl() dockerCtl {
	return dockerCtl{
		name: "socket",
		run:  func(args ...string) (string, string, int) { return runCtl(b.RuntimeDir, args...) },
		credFile: func(t testing.TB, content string) string {
			p := filepath.Join(t.TempDir(), "cred.json")
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		},
	}
}

func (b *dockerBox) execCtl() dockerCtl {
	return dockerCtl{
		name: "exec",
		run: func(args ...string) (string, string, int) {
			return dockerCmd("", append([]string{"exec", b.Name, "shim", "ctl"}, args...)...)
		},
		credFile: func(t testing.TB, content string) string {
			p := "/root/cred-" + randName("") + ".json"
			if _, errs, code := dockerCmd(content, "exec", "-i", b.Name, "sh", "-c", "umask 077; cat > "+p); code != 0 {
				t.Fatalf("write credential file in %s: %s", b.Name, errs)
			}
			return p
		},
	}
}

func (c dockerCtl) must(t testing.TB, v any, args ...string) {
	t.Helper()
	out, errs, code := c.run(args...)
	if code != 0 {
		t.Fatalf("ctl (%s) %s: exit %d: %s", c.name, strings.Join(args, " "), code, errs)
	}
	if v != nil {
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("ctl (%s) %s: bad JSON %q: %v", c.name, strings.Join(args, " "), out, err)
		}
	}
}

// dockerSeedFiles are the seed commit of the git server: a tracked file and an
// ignore rule for the worktree checks.
var dockerSeedFiles = map[string]string{"tracked.txt": "baseline\n", ".gitignore": "*.tmp\n"}

// dockerCredJSON is a --credential-file for the test server.
func dockerCredJSON(host, user, pass string) string {
	b, _ := json.Marshal([]map[string]string{{"protocol": "http", "host": host, "username": user, "password": pass}})
	return string(b)
}

// dockerAgentScript is the fake agent of the seed scenario: it edits the
// checkout (tracked and untracked), commits, starts a daemon that escapes
// its process group and parent (setsid, double fork), then pushes to
// BRANCH in a loop and keeps editing.
const dockerAgentScript = `
cd /workspace/repo || exit 1
git config user.name agent; git config user.email agent@example.com
echo "gen $GEN edit" >> tracked.txt
echo "gen $GEN notes" > notes.txt
git commit -qam "gen $GEN: first commit"
sh -c 'setsid sh -c "while :; do date >> daemon.log; sleep 0.2; done" &' &
i=0
while :; do
	i=$((i+1))
	echo "gen $GEN push $i" >> tracked.txt
	git commit -qam "gen $GEN: push $i"
	git push -q origin "HEAD:refs/heads/$BRANCH" 2>>push-errors.log && echo "$i" > pushed.count
	sleep 0.3
done
`

// dockerGen2Script records how it found the worktree, then commits and
// pushes once and exits 0.
const dockerGen2Script = `
cd /workspace/repo || exit 1
{ git rev-parse HEAD; git status --porcelain --untracked-files=all; } > /tmp/gen2-found
git config user.name agent; git config user.email agent@example.com
echo "gen 2 work" > gen2.txt
git add gen2.txt && git commit -qm "gen 2" && git push -q origin "HEAD:refs/heads/$BRANCH"
`

// dockerClone checks the repository out inside the container as the agent.
func dockerClone(t testing.TB, b *dockerBox, url string) {
	t.Helper()
	b.MustExec("agent", "git", "clone", "-q", url, "/workspace/repo")
}

func TestDockerSeedScenario(t *testing.T) {
	dockerImage(t)
	for _, via := range []string{"socket", "exec"} {
		t.Run(via, func(t *testing.T) {
			b := dockerRun(t, dockerFullFlags, "--grace", "5s")
			ctl := b.hostCtl()
			if via == "exec" {
				ctl = b.execCtl()
			}
			dockerSeed(t, b, ctl, "scan")
		})
	}
}

// The seed scenario with layers, under the documented flags: the full
// fencing flags and a volume for the layers dir (the container's
// fuse-overlayfs root cannot hold an overlayfs upper).
func TestDockerSeedScenarioWithLayers(t *testing.T) {
	dockerImage(t)
	flags := append(append([]string{}, dockerFullFlags...), "-v", t.TempDir()+":/var/lib/shim")
	b := dockerRun(t, flags, "--grace", "5s", "--isolation", "auto")
	dockerSeed(t, b, b.hostCtl(), "layers")
}

// dockerSeed runs the seed scenario in b; isolation is what status must
// say. With layers, a generation's worktree is seen from outside through
// its harness's root (/proc/PID/root): docker exec sees the lower.
func dockerSeed(t *testing.T, b *dockerBox, ctl dockerCtl, isolation string) {
	pass1, pass2 := randName("p1-"), randName("p2-")
	srv := startGitServer(t, gitServerOpts{AnonFetch: true, Seed: dockerSeedFiles, Accounts: map[string]gitAccount{"agent1": {Password: pass1}, "agent2": {Password: pass2}}})
	base := srv.Seed
	dockerClone(t, b, srv.URL)

	var st api.Status
	eventually(t, 30*time.Second, "the start-up probes done", func() bool {
		ctl.must(t, &st, "status")
		return st.Isolation.Mode != "probing"
	})
	if st.Mode != "cgroup2" || st.ShimPid != 1 || st.Subreaper {
		t.Fatalf("want cgroup2 with shim as PID 1: %+v", st)
	}
	if st.Isolation.Mode != isolation {
		t.Fatalf("isolation %+v, want %s", st.Isolation, isolation)
	}

	// Generation 1: the agent, with its own credential, pushing in a loop.
	var r1 api.StartResult
	ctl.must(t, &r1, "start", "--generation", "1", "--user", "1000:1000", "--cwd", "/workspace/repo",
		"--env", "HOME=/home/agent", "--env", "GEN=1", "--env", "BRANCH=agent-gen1",
		"--worktree", "/workspace/repo", "--baseline", base, "--network", "host",
		"--credential-file", ctl.credFile(t, dockerCredJSON(srv.HostPort, "agent1", pass1)),
		"--", "sh", "-c", dockerAgentScript)
	if r1.Generation != 1 || r1.Pid == 0 {
		t.Fatalf("start 1: %+v", r1)
	}
	eventually(t, 30*time.Second, "gen 1 pushed twice", func() bool { return len(srv.Pushes("agent1")) >= 2 })
	view, viewer := "", ""
	if isolation == "layers" {
		// the harness's uid may read its root; the container's root lacks
		// CAP_SYS_PTRACE under Docker's default capabilities
		view, viewer = fmt.Sprintf("/proc/%d/root", r1.Pid), "agent"
	}
	eventually(t, 10*time.Second, "gen 1's daemon writing", func() bool {
		_, _, code := b.Exec(viewer, "test", "-s", view+"/workspace/repo/daemon.log")
		return code == 0
	})

	if isolation == "layers" {
		// A tool call run the way users run them (docker exec -u agent,
		// outside any generation) cannot write the lower (issue 22).
		out, _, _ := b.Exec("agent", "sh", "-c", "(echo tool > /workspace/repo/tool.txt) 2>&1; a=$?; (echo tool >> /workspace/repo/tracked.txt) 2>&1; echo rc=$a,$?")
		if !strings.Contains(out, "Read-only file system") || !strings.Contains(out, "rc=") || strings.Contains(out, "rc=0") || strings.HasSuffix(strings.TrimSpace(out), ",0") {
			t.Errorf("docker exec -u agent wrote the lower: %q", out)
		}
	}

	// The supervisor restarts and announces generation 2.
	var r2 api.StartResult
	ctl.must(t, &r2, "start", "--generation", "2", "--user", "1000:1000", "--cwd", "/workspace/repo",
		"--env", "HOME=/home/agent", "--env", "BRANCH=agent-gen2",
		"--worktree", "/workspace/repo", "--baseline", base, "--network", "host",
		"--credential-file", ctl.credFile(t, dockerCredJSON(srv.HostPort, "agent2", pass2)),
		"--", "sh", "-c", dockerGen2Script)
	fenceDone := time.Now()
	// A push gen 1 had sent whole before the freeze is the server's to
	// carry out (what a fence cannot recall); gen 1's branch is read once
	// every request begun before the fence has been answered, and must not
	// move after that.
	eventually(t, 30*time.Second, "the requests begun before the fence answered", func() bool { return srv.Settled(fenceDone) })
	gen1Ref := srv.Ref("refs/heads/agent-gen1")
	if len(r2.Fenced) != 1 {
		t.Fatalf("gen 2 must fence exactly gen 1: %+v", r2)
	}
	rep := r2.Fenced[0]
	t.Logf("fence report: killed %d survivors %d snapshot %s %s durations %v",
		rep.Killed, rep.Survivors, rep.SnapshotRef, rep.SnapshotCommit, rep.DurationsMS)
	if rep.Generation != 1 || rep.Survivors != 0 || rep.Killed < 3 {
		t.Errorf("fence report: %+v", rep)
	}
	if rep.SnapshotRef != "refs/shim/abandoned/1" || rep.SnapshotCommit == "" || rep.Baseline != base {
		t.Errorf("fence report worktree: ref %q commit %q baseline %q (want baseline %s)", rep.SnapshotRef, rep.SnapshotCommit, rep.Baseline, base)
	}
	if rep.Cut == nil || rep.Cut.CredentialsRevoked < 1 {
		t.Errorf("fence report: credentials not revoked: %+v", rep.Cut)
	}
	if w := rep.Worktree; isolation == "layers" && (w == nil || w.Isolation != "layers") {
		t.Errorf("the snapshot is not the worktree layer's: %+v", w)
	} else if isolation == "layers" && (w.Lower == nil || !w.Lower.Locked || len(w.Lower.MetadataRestored) != 0) {
		t.Errorf("the fence's lower check: %+v", w.Lower)
	}

	// Generation 2 completes and pushes.
	var exit api.Exit
	waitOut, waitErr, _ := ctl.run("wait", "--generation", "2") // its exit code is gen 2's
	if err := json.Unmarshal([]byte(waitOut), &exit); err != nil || exit.ExitCode != 0 {
		out, _, _ := b.Exec("", "cat", "/run/shim/gen/2/stderr", "/run/shim/gen/2/stdout")
		t.Fatalf("gen 2 exit %+v %s: %s", exit, waitErr, out)
	}
	if len(srv.PushesSince("agent2", fenceDone)) != 1 || srv.Ref("refs/heads/agent-gen2") == "" {
		t.Errorf("gen 2 did not push: %+v", srv.Requests())
	}
	// gen 2 found the worktree at the baseline, clean: no edit, no
	// untracked file, no daemon.log.
	foundAt := "/tmp/gen2-found"
	if isolation == "layers" {
		foundAt = "/var/lib/shim/layers/root/2/upper/tmp/gen2-found" // it wrote in its root layer
	}
	found := strings.Fields(b.MustExec("", "cat", foundAt))
	if len(found) != 1 || found[0] != base {
		t.Errorf("gen 2 found the worktree at %q, want %s and clean", found, base)
	}
	// The abandoned edits are saved: gen 1's commits and its untracked notes.
	if got := b.MustExec("agent", "git", "-C", "/workspace/repo", "show", "refs/shim/abandoned/1:notes.txt"); !strings.Contains(got, "gen 1 notes") {
		t.Errorf("snapshot lacks the untracked edit: %q", got)
	}
	if got := b.MustExec("agent", "git", "-C", "/workspace/repo", "show", "refs/shim/abandoned/1:tracked.txt"); !strings.Contains(got, "gen 1 push") {
		t.Errorf("snapshot lacks the tracked edits: %q", got)
	}
	// Nothing of gen 1 acts after the fence: no push by agent1 (and no
	// change of its branch), no daemon writing.
	time.Sleep(1500 * time.Millisecond)
	if p := srv.PushesSince("agent1", fenceDone); len(p) != 0 {
		t.Errorf("gen 1 pushed after the fence: %+v", p)
	}
	for _, r := range srv.Requests() {
		if r.At.After(fenceDone) && r.ReceivePack() && r.User != "agent2" {
			t.Errorf("receive-pack after the fence not by gen 2: %+v", r)
		}
	}
	if now := srv.Ref("refs/heads/agent-gen1"); now != gen1Ref {
		t.Errorf("agent-gen1 moved after the fence: %s -> %s", gen1Ref, now)
	}
	if _, _, code := b.Exec("", "test", "-e", "/workspace/repo/daemon.log"); code == 0 {
		t.Errorf("gen 1's daemon still writes daemon.log after the fence")
	}
	// Only shim is left in the container (besides this exec).
	if ps := dockerProcs(t, b); len(ps) != 0 {
		t.Errorf("processes left in the container besides shim: %q", ps)
	}
}

// dockerProcs lists "pid comm" of every process in the container except
// shim (PID 1) and the docker exec shell that lists them (the image has no
// ps).
func dockerProcs(t testing.TB, b *dockerBox) []string {
	t.Helper()
	out := b.MustExec("", "sh", "-c",
		`for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] && continue; read c < $d/comm 2>/dev/null && echo "$p $c"; done; true`)
	var ps []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l != "" {
			ps = append(ps, l)
		}
	}
	return ps
}

// dockerExitCode is the container's exit code once it stopped.
func dockerExitCode(t testing.TB, name string) int {
	t.Helper()
	out := dockerMust(t, "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", name)
	f := strings.Fields(out)
	if len(f) != 2 || f[0] != "false" {
		t.Fatalf("container %s still running: %q", name, out)
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// docker stop sends SIGTERM to shim (PID 1); shim ends the harness within
// its grace period and the container exits with the harness's code.
func TestDockerStop(t *testing.T) {
	dockerImage(t)
	cases := []struct {
		name   string
		script string
		code   int
		min    time.Duration
		max    time.Duration
	}{
		{"harness exits on TERM", `trap 'exit 42' TERM; echo up > /tmp/up; while :; do sleep 0.05; done`, 42, 0, 2 * time.Second},
		{"harness ignores TERM", `trap '' TERM; echo up > /tmp/up; while :; do sleep 0.05; done`, 137, 2 * time.Second, 5 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := dockerRun(t, dockerFullFlags, "--grace", "2s")
			ctl := b.hostCtl()
			ctl.must(t, nil, "start", "--generation", "1", "--user", "1000:1000", "--", "sh", "-c", c.script)
			eventually(t, 10*time.Second, "harness up", func() bool { _, _, code := b.Exec("", "test", "-e", "/tmp/up"); return code == 0 })
			t0 := time.Now()
			dockerMust(t, "stop", "-t", "20", b.Name)
			took := time.Since(t0)
			code := dockerExitCode(t, b.Name)
			t.Logf("docker stop took %v, exit code %d", took, code)
			if code != c.code {
				t.Errorf("container exit code %d, want %d", code, c.code)
			}
			if took < c.min || took > c.max {
				t.Errorf("docker stop took %v, want between %v and %v (grace 2s, docker timeout 20s)", took, c.min, c.max)
			}
			var exit api.Exit
			data, err := os.ReadFile(filepath.Join(b.RuntimeDir, "gen", "1", "exit.json"))
			if err != nil || json.Unmarshal(data, &exit) != nil || exit.ExitCode != c.code {
				t.Errorf("exit record on the host: %s %v", data, err)
			}
		})
	}
}

// With too few rights shim falls back and says what is missing and which
// docker run flags give cgroup2; with them it mounts cgroup2 itself.
func TestDockerModes(t *testing.T) {
	dockerImage(t)
	cases := []struct {
		name    string
		flags   []string
		mode    string
		want    []string // in mode_reason
		notWant []string
	}{
		{"no flags", nil, "pidns", []string{"run with --cap-add SYS_ADMIN --cgroupns=private for cgroup2", "--cap-add NET_ADMIN"}, nil},
		{"cgroupns private", []string{"--cgroupns=private"}, "pidns", []string{"run with --cap-add SYS_ADMIN for cgroup2"}, []string{"--cgroupns=private"}},
		{"SYS_ADMIN only", []string{"--cap-add", "SYS_ADMIN"}, "pidns", []string{"run with --cgroupns=private for cgroup2", "host's cgroup namespace"}, nil},
		{"SYS_ADMIN cgroupns private", []string{"--cgroupns=private", "--cap-add", "SYS_ADMIN"}, "cgroup2",
			[]string{"shim mounted cgroup2 at /sys/fs/cgroup/unified", "need --cap-add NET_ADMIN"}, nil},
		{"full", dockerFullFlags, "cgroup2", []string{"shim mounted cgroup2"}, []string{"--cap-add"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := dockerRun(t, c.flags)
			var st api.Status
			b.hostCtl().must(t, &st, "status")
			t.Logf("mode %s: %s", st.Mode, st.ModeReason)
			if st.Mode != c.mode {
				t.Errorf("mode %q, want %q", st.Mode, c.mode)
			}
			for _, w := range c.want {
				if !strings.Contains(st.ModeReason, w) {
					t.Errorf("mode_reason lacks %q", w)
				}
			}
			for _, w := range c.notWant {
				if strings.Contains(st.ModeReason, w) {
					t.Errorf("mode_reason has %q", w)
				}
			}
			// Whatever the mode, a fence ends an escaping harness completely.
			ctl := b.hostCtl()
			ctl.must(t, nil, "start", "--generation", "1", "--", "sh", "-c",
				`sh -c 'setsid sleep 1000 &' & echo up > /tmp/up; sleep 1000`)
			eventually(t, 10*time.Second, "harness up", func() bool { _, _, code := b.Exec("", "test", "-e", "/tmp/up"); return code == 0 })
			var fr api.FenceResult
			ctl.must(t, &fr, "fence", "--generation", "2")
			if len(fr.Fenced) != 1 || fr.Fenced[0].Survivors != 0 || fr.Fenced[0].Killed < 2 {
				t.Errorf("fence in mode %s: %+v", st.Mode, fr)
			}
		})
	}
}

// A sandbox (container) restart between two generations loses no
// abandoned edit: the worktree layer is on the layers volume, the restarted
// shim adopts generation 1 from state.json and its fence makes the layer
// the snapshot.
func TestDockerRestartKeepsTheLayer(t *testing.T) {
	dockerImage(t)
	vol := t.TempDir()
	flags := append(append([]string{}, dockerFullFlags...), "-v", vol+":/var/lib/shim")
	b := dockerRun(t, flags, "--grace", "1s", "--isolation", "auto")
	ctl := b.hostCtl()
	var st api.Status
	eventually(t, 30*time.Second, "the start-up probes done", func() bool {
		ctl.must(t, &st, "status")
		return st.Isolation.Mode != "probing"
	})
	if st.Isolation.Mode != "layers" {
		t.Fatalf("isolation %+v, want layers", st.Isolation)
	}
	const wt = "/workspace/repo"
	b.MustExec("agent", "sh", "-c", "mkdir -p "+wt+" && cd "+wt+" && git init -q -b main && echo base > f && git add f && "+
		"git -c user.name=a -c user.email=a@b commit -qm base")
	ctl.must(t, nil, "start", "--generation", "1", "--user", "1000:1000", "--worktree", wt, "--", "sh", "-c",
		"cd "+wt+" && echo edit > f && echo new > n && sleep 1000")
	upper := filepath.Join(vol, "layers", "wt", layers.WorktreeKey(wt), "1", "upper")
	eventually(t, 10*time.Second, "gen 1's edits in its layer", func() bool {
		_, err := os.Stat(filepath.Join(upper, "n"))
		return err == nil
	})
	dockerMust(t, "restart", "-t", "10", b.Name)
	b.waitReady(t)
	var r2 api.StartResult
	ctl.must(t, &r2, "start", "--generation", "2", "--user", "1000:1000", "--worktree", wt, "--", "true")
	if len(r2.Fenced) != 1 || r2.Fenced[0].Worktree == nil || r2.Fenced[0].Worktree.Isolation != "layers" {
		t.Fatalf("gen 1 not fenced from its layer after the restart: %+v", r2.Fenced)
	}
	for path, want := range map[string]string{"f": "edit", "n": "new"} {
		if got := strings.TrimSpace(b.MustExec("agent", "git", "-C", wt, "show", "refs/shim/abandoned/1:"+path)); got != want {
			t.Errorf("snapshot %s = %q, want %q", path, got, want)
		}
	}
	if got := strings.TrimSpace(b.MustExec("agent", "cat", wt+"/f")); got != "base" {
		t.Errorf("the checkout is %q after the fence, want the baseline's", got)
	}
}
