package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
	"github.com/shimdev/shim/internal/sandbox"
	"github.com/shimdev/shim/internal/testutil"
)

// The seed scenario on DBOS, end to end and for real: Postgres, shim as
// PID 1 of its own namespaces, a git smart-HTTP server, the supervisor of
// this directory as a separate process. The supervisor runs task-42; its
// step mints generation 1 and announces it; the harness pushes every
// ~100 ms. The supervisor is SIGKILLed mid-step ("the deploy"), and started
// again after a 3 s gap: DBOS recovers the workflow by itself and re-runs
// the step, which mints generation 2; announcing it fences generation 1.
// Checked: the recovery, generation 1 fenced with 0 survivors, its last
// uncommitted edit in refs/shim/abandoned/1, generation 2 on the baseline,
// no push of generation 1 after the fence; with a lease, no push of
// generation 1 after its suspension. Without a lease (the control) the
// abandoned generation pushes during the gap.

const (
	harnessUID = 4247
	gap        = 3 * time.Second
	task       = "task-42"
)

var builds struct {
	once             sync.Once
	shim, supervisor string
	err              error
}

// binaries builds shim ($SHIM_BIN, or scripts/build) and the supervisor.
func binaries(t *testing.T) (shimBin, supervisor string) {
	t.Helper()
	builds.once.Do(func() {
		dir, err := os.MkdirTemp("", "shim-dbos-bin-")
		if err != nil {
			builds.err = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			builds.err = err
			return
		}
		builds.shim = os.Getenv("SHIM_BIN")
		if builds.shim == "" {
			builds.shim = filepath.Join(dir, "shim")
			if out, err := exec.Command("../../scripts/build", builds.shim).CombinedOutput(); err != nil {
				builds.err = &buildError{"scripts/build", err, out}
				return
			}
		}
		builds.supervisor = filepath.Join(dir, "supervisor")
		if out, err := exec.Command("go", "build", "-o", builds.supervisor, ".").CombinedOutput(); err != nil {
			builds.err = &buildError{"go build", err, out}
		}
	})
	if builds.err != nil {
		t.Fatal(builds.err)
	}
	return builds.shim, builds.supervisor
}

type buildError struct {
	what string
	err  error
	out  []byte
}

func (e *buildError) Error() string { return e.what + ": " + e.err.Error() + "\n" + string(e.out) }

// supervisorProc is one run of the supervisor, its JSON lines collected.
type supervisorProc struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []map[string]any
	done  chan struct{}
}

func startSupervisor(t *testing.T, bin string, env []string) *supervisorProc {
	t.Helper()
	p := &supervisorProc{cmd: exec.Command(bin), done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stderr = os.Stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				p.mu.Lock()
				p.lines = append(p.lines, m)
				p.mu.Unlock()
			}
		}
		p.cmd.Wait()
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// event is the first line of type typ (and generation gen, when > 0).
func (p *supervisorProc) event(typ string, gen float64) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if l["event"] == typ && (gen == 0 || l["generation"] == gen) {
			return l
		}
	}
	return nil
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSeedScenario(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "not root")
	testutil.Need(t, sandbox.Cgroup2Mount() != "", "no cgroup2 mount")
	_, err := exec.LookPath("git")
	testutil.Need(t, err == nil, "no git")
	pg := startPostgres(t)
	shimBin, supBin := binaries(t)
	for _, tc := range []struct {
		name  string
		lease time.Duration
	}{{"no lease", 0}, {"lease", time.Second}} {
		t.Run(tc.name, func(t *testing.T) { seedScenario(t, pg, shimBin, supBin, tc.lease) })
	}
}

func randHex() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func seedScenario(t *testing.T, pg *postgres, shimBin, supBin string, lease time.Duration) {
	db := pg.database(t, "seed_"+randHex())
	pw := "s3cret-" + randHex()
	root := testutil.HarnessDir(t, -1)
	srv := testutil.StartGitServer(t, testutil.GitServerOptions{Root: root,
		Accounts: map[string]testutil.GitAccount{"bot": {Password: pw, Branch: task}}})

	// The sandbox: a checkout of the seed owned by the harness's uid,
	// the harness, the push credential (root-only), shim.
	work := testutil.HarnessDir(t, harnessUID)
	wt := filepath.Join(work, "wt")
	git(t, "", "clone", "-q", srv.Bare, wt)
	git(t, wt, "remote", "set-url", "origin", srv.URL)
	home := testutil.HarnessDir(t, harnessUID)
	testutil.ChownR(t, work, harnessUID)
	harness := filepath.Join(testutil.HarnessDir(t, -1), "harness.sh")
	b, err := os.ReadFile("harness.sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(harness, b, 0o755); err != nil {
		t.Fatal(err)
	}
	credFile := filepath.Join(t.TempDir(), "credentials.json")
	cb, _ := json.Marshal([]api.Credential{{Protocol: "http", Host: srv.HostPort, Username: "bot", Password: pw}})
	if err := os.WriteFile(credFile, cb, 0o600); err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.Start(sandbox.Options{Bin: shimBin, Name: "dbos", Args: []string{"--grace", "2s"}, Out: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Close)
	shim := client.New(sb.RuntimeDir)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, n := range []uint64{1, 2} {
			if g, err := shim.Generation(context.Background(), n); err == nil {
				b, _ := os.ReadFile(g.Stderr)
				t.Logf("generation %d (%s) stderr:\n%s", n, g.State, b)
			}
		}
		b, _ := os.ReadFile(filepath.Join(home, "push.err"))
		t.Logf("push errors:\n%s", b)
	})
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "DBOS_SYSTEM_DATABASE_URL=" + db,
		"SHIM_RUNTIME_DIR=" + sb.RuntimeDir, "TASK=" + task, "WORKTREE=" + wt, "BRANCH=" + task,
		"HARNESS=" + harness, "HARNESS_USER=" + strconv.Itoa(harnessUID) + ":" + strconv.Itoa(harnessUID), "HARNESS_HOME=" + home,
		"CREDENTIAL_FILE=" + credFile}
	if lease > 0 {
		env = append(env, "LEASE="+lease.String())
	}
	pushesOf := func(gen string, after time.Time) int {
		n := 0
		for _, r := range srv.PushesSince("bot", after) {
			if r.Tip != "" && strings.HasPrefix(srv.Git(t, "log", "-1", "--format=%s", r.Tip), "gen "+gen+" ") {
				n++
			}
		}
		return n
	}

	// Supervisor 1 runs the step; generation 1 pushes.
	sup1 := startSupervisor(t, supBin, env)
	eventually(t, 120*time.Second, "generation 1 started and pushing twice", func() bool {
		return sup1.event("started", 1) != nil && pushesOf("1", time.Time{}) >= 2
	})

	// The deploy: supervisor 1 dies mid-step.
	killAt := time.Now()
	sup1.cmd.Process.Signal(syscall.SIGKILL)
	<-sup1.done
	var suspendedAt, frozenAt time.Time
	inFlight := 0 // gen 1's connections to the git server that had delivered a request at the freeze
	if lease > 0 {
		eventually(t, 60*time.Second, "generation 1 suspended", func() bool {
			g, err := shim.Generation(context.Background(), 1)
			if err == nil && g.Lease != nil && g.Lease.Suspended && g.Lease.Cut != nil && g.Lease.FrozenAt != nil {
				suspendedAt, frozenAt = *g.Lease.SuspendedAt, *g.Lease.FrozenAt
				for _, c := range g.Lease.Cut.Connections {
					if c.InFlight && (c.Remote == srv.HostPort || c.Target == srv.HostPort) {
						inFlight++
					}
				}
				return true
			}
			return false
		})
	} else {
		eventually(t, 60*time.Second, "a push by abandoned generation 1", func() bool { return pushesOf("1", killAt) > 0 })
	}
	time.Sleep(time.Until(killAt.Add(gap))) // the deploy takes this long: a scenario's length, not a synchronisation

	// Supervisor 2: DBOS recovers the workflow and re-runs the step.
	restartAt := time.Now()
	sup2 := startSupervisor(t, supBin, append(env, "RECOVER=1"))
	eventually(t, 120*time.Second, "generation 2 started by the recovered step", func() bool { return sup2.event("started", 2) != nil })
	var started api.StartResult
	raw, _ := json.Marshal(sup2.event("started", 2))
	if err := json.Unmarshal(raw, &started); err != nil {
		t.Fatal(err)
	}
	gap1 := pushesOf("1", killAt) - pushesOf("1", started.StartedAt)
	after := pushesOf("1", started.StartedAt)

	g1, err := shim.Generation(context.Background(), 1)
	if err != nil || g1.Fence == nil {
		t.Fatalf("generation 1's record: %+v %v", g1, err)
	}
	rep := g1.Fence
	if rep.Survivors != 0 || rep.Killed == 0 || rep.SnapshotRef != "refs/shim/abandoned/1" {
		t.Errorf("generation 1's fence: killed %d survivors %d snapshot %q", rep.Killed, rep.Survivors, rep.SnapshotRef)
	}
	if wip := git(t, wt, "show", "refs/shim/abandoned/1:wip.txt"); !strings.HasPrefix(wip, "gen 1 uncommitted ") {
		t.Errorf("generation 1's uncommitted edit is not in its snapshot: %q", wip)
	}
	if started.Baseline != srv.Seed {
		t.Errorf("generation 2 starts on %s, not on the baseline %s", started.Baseline, srv.Seed)
	}
	if after != 0 {
		t.Errorf("%d pushes of generation 1 after the fence", after)
	}
	afterSuspension, afterFreeze := -1, -1
	if lease > 0 {
		// Nothing of gen 1 runs after the freeze: a push the server began
		// to read after it was delivered before, on a connection the
		// suspension's report says was in flight (the server reads what
		// its kernel received before the reset). Anything more is a push
		// the suspension let through.
		afterSuspension, afterFreeze = pushesOf("1", suspendedAt), pushesOf("1", frozenAt)
		if afterFreeze > inFlight {
			t.Errorf("%d pushes of generation 1 began after its freeze, %d connections in flight at it", afterFreeze, inFlight)
		}
	}

	// Generation 2 finishes; the workflow completes with its outcome.
	// Told to finish once it is listening: its first push comes after its
	// trap (a USR1 before it killed gen 2 with exit 138 in 2 of 30 runs).
	eventually(t, 60*time.Second, "generation 2 pushed", func() bool { return pushesOf("2", time.Time{}) > 0 })
	if err := shim.Signal(context.Background(), 2, "USR1", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 120*time.Second, "the workflow's result", func() bool { return sup2.event("result", 0) != nil })
	res := sup2.event("result", 0)["outcome"].(map[string]any)
	if res["generation"] != float64(2) || res["exit_code"] != float64(0) {
		t.Errorf("the workflow's outcome: %v", res)
	}
	suspended := "no lease"
	if lease > 0 {
		suspended = fmt.Sprintf("suspended %v after the kill, frozen %v later; pushes after the lease ran out %d, after the freeze %d (in flight at it: %d)",
			suspendedAt.Sub(killAt).Round(time.Millisecond), frozenAt.Sub(suspendedAt).Round(time.Microsecond), afterSuspension, afterFreeze, inFlight)
	}
	t.Logf("lease %v: restart to generation 2 running %v (its announcement: fence %.1f ms, total %.1f ms); gen 1 pushes: before the kill %d, from the kill to generation 2 %d, after the fence %d; %s",
		lease, started.StartedAt.Sub(restartAt).Round(time.Millisecond), started.DurationsMS["fence"], started.DurationsMS["total"],
		pushesOf("1", time.Time{})-pushesOf("1", killAt), gap1, after, suspended)
}

// git runs git as root with no user or system config.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*"}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}
