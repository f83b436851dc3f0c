package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
	"github.com/shimdev/shim/internal/sandbox"
	"github.com/shimdev/shim/internal/testutil"
)

// The seed scenario with AGENT=exec: the agent loop runs in the DBOS step,
// in the supervisor, and its tool calls (harness.sh's edit, commit, push
// and uncommitted edit, round after round, plus a long-running watcher
// with a setsid grandchild) go through exec into an idle generation
// announced with a 1 s lease. The supervisor is SIGKILLed mid-step; the
// generation's lease runs out (it is suspended: frozen, cut), the
// supervisor is started again, DBOS recovers the workflow and re-runs the
// step, which announces generation 2: generation 1 is fenced with its tool
// calls (0 survivors, the watcher listed), its uncommitted edit is in
// refs/shim/abandoned/1, no push of generation 1 lands after the fence;
// generation 2 runs its own tool calls on the baseline, finishes when told
// and ends its generation, and the workflow completes with its outcome.
func TestSeedScenarioExec(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "not root")
	testutil.Need(t, sandbox.Cgroup2Mount() != "", "no cgroup2 mount")
	_, err := exec.LookPath("git")
	testutil.Need(t, err == nil, "no git")
	pg := startPostgres(t)
	shimBin, supBin := binaries(t)

	db := pg.database(t, "exec_"+randHex())
	pw := "s3cret-" + randHex()
	srv := testutil.StartGitServer(t, testutil.GitServerOptions{Root: testutil.HarnessDir(t, -1),
		Accounts: map[string]testutil.GitAccount{"bot": {Password: pw, Branch: task}}})
	work := testutil.HarnessDir(t, harnessUID)
	wt := filepath.Join(work, "wt")
	git(t, "", "clone", "-q", srv.Bare, wt)
	git(t, wt, "remote", "set-url", "origin", srv.URL)
	home := testutil.HarnessDir(t, harnessUID)
	testutil.ChownR(t, work, harnessUID)
	credFile := filepath.Join(t.TempDir(), "credentials.json")
	cb, _ := json.Marshal([]api.Credential{{Protocol: "http", Host: srv.HostPort, Username: "bot", Password: pw}})
	if err := os.WriteFile(credFile, cb, 0o600); err != nil {
		t.Fatal(err)
	}
	sb, err := sandbox.Start(sandbox.Options{Bin: shimBin, Name: "dbos-exec", Args: []string{"--grace", "2s"}, Out: os.Stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sb.Close)
	shim := client.New(sb.RuntimeDir)
	ctx := context.Background()
	finish := filepath.Join(t.TempDir(), "finish")
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "DBOS_SYSTEM_DATABASE_URL=" + db,
		"SHIM_RUNTIME_DIR=" + sb.RuntimeDir, "TASK=" + task, "WORKTREE=" + wt, "BRANCH=" + task,
		"HARNESS_USER=" + strconv.Itoa(harnessUID) + ":" + strconv.Itoa(harnessUID), "HARNESS_HOME=" + home,
		"CREDENTIAL_FILE=" + credFile, "LEASE=1s", "AGENT=exec", "FINISH_FILE=" + finish}
	pushesOf := func(gen string, after time.Time) int {
		n := 0
		for _, r := range srv.PushesSince("bot", after) {
			if r.Tip != "" && strings.HasPrefix(srv.Git(t, "log", "-1", "--format=%s", r.Tip), "gen "+gen+" ") {
				n++
			}
		}
		return n
	}
	watcherRunning := func(gen uint64) bool {
		ps, err := shim.Processes(ctx, gen)
		if err != nil {
			return false
		}
		for _, p := range ps {
			if p.Labels["tool"] == "watcher" && p.State == api.ProcessRunning {
				return true
			}
		}
		return false
	}

	// Supervisor 1: generation 1 idle, the agent's tool calls in it.
	sup1 := startSupervisor(t, supBin, env)
	eventually(t, 120*time.Second, "generation 1 idle, its watcher running and two pushes", func() bool {
		return sup1.event("started", 1) != nil && watcherRunning(1) && pushesOf("1", time.Time{}) >= 2
	})
	if g, err := shim.Generation(ctx, 1); err != nil || !g.Idle {
		t.Fatalf("generation 1 should be idle: %+v %v", g, err)
	}

	// The deploy: supervisor 1 dies mid-step; nothing renews the lease.
	sup1.cmd.Process.Signal(syscall.SIGKILL)
	<-sup1.done
	eventually(t, 60*time.Second, "generation 1 suspended", func() bool {
		g, err := shim.Generation(ctx, 1)
		return err == nil && g.Lease != nil && g.Lease.Suspended && g.Lease.Cut != nil && g.Lease.FrozenAt != nil
	})

	// Supervisor 2: DBOS recovers the workflow and re-runs the step.
	sup2 := startSupervisor(t, supBin, append(env, "RECOVER=1"))
	eventually(t, 120*time.Second, "generation 2 started by the recovered step", func() bool { return sup2.event("started", 2) != nil })
	var started api.StartResult
	raw, _ := json.Marshal(sup2.event("started", 2))
	if err := json.Unmarshal(raw, &started); err != nil {
		t.Fatal(err)
	}
	g1, err := shim.Generation(ctx, 1)
	if err != nil || g1.Fence == nil {
		t.Fatalf("generation 1's record: %+v %v", g1, err)
	}
	rep := g1.Fence
	watcherListed := false
	for _, c := range rep.ToolCalls {
		watcherListed = watcherListed || strings.Contains(strings.Join(c.Command, " "), "watch-")
	}
	if rep.Survivors != 0 || rep.Killed == 0 || !watcherListed || rep.SnapshotRef != "refs/shim/abandoned/1" {
		t.Errorf("generation 1's fence: killed %d survivors %d tool calls %+v snapshot %q", rep.Killed, rep.Survivors, rep.ToolCalls, rep.SnapshotRef)
	}
	ps, err := shim.Processes(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.State == api.ProcessRunning {
			t.Errorf("a tool call of generation 1 still running after the fence: %+v", p)
		}
	}
	if wip := git(t, wt, "show", "refs/shim/abandoned/1:wip.txt"); !strings.HasPrefix(wip, "gen 1 uncommitted ") {
		t.Errorf("generation 1's uncommitted edit is not in its snapshot: %q", wip)
	}
	if started.Baseline != srv.Seed {
		t.Errorf("generation 2 starts on %s, not on the baseline %s", started.Baseline, srv.Seed)
	}

	// Generation 2 pushes its own work, is told to finish, and ends.
	eventually(t, 60*time.Second, "generation 2 pushed", func() bool { return pushesOf("2", time.Time{}) > 0 })
	if err := os.WriteFile(finish, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	eventually(t, 120*time.Second, "the workflow's result", func() bool { return sup2.event("result", 0) != nil })
	res := sup2.event("result", 0)["outcome"].(map[string]any)
	if res["generation"] != float64(2) || res["tool_calls"] == nil || res["tool_calls"].(float64) < 4 {
		t.Errorf("the workflow's outcome: %v", res)
	}
	if g2, err := shim.Generation(ctx, 2); err != nil || g2.State != api.GenFenced || g2.Fence == nil || g2.Fence.Survivors != 0 {
		t.Errorf("generation 2 after the workflow: %+v %v", g2, err)
	}
	if after := pushesOf("1", started.StartedAt); after != 0 {
		t.Errorf("%d pushes of generation 1 after the fence", after)
	}
	t.Logf("generation 1: %d tool calls fenced, killed %d; restart to generation 2 running: its announcement %.1f ms (fence %.1f ms); gen 2: %v tool calls",
		len(rep.ToolCalls), rep.Killed, started.DurationsMS["total"], started.DurationsMS["fence"], res["tool_calls"])
}
