// Command supervisor is a supervisor of one shim sandbox on DBOS
// (dbos-transact-golang and Postgres): each task is a durable workflow whose
// step runs the agent harness as a shim generation. The step mints the
// generation in Postgres in its own transaction, so every attempt of the
// step (a retry, or DBOS's recovery after the supervisor died mid-step) is
// a newer generation, and announcing it fences the attempt before it:
// the recovery policy "fence and re-run" of docs/supervisors.md.
//
// It reads its settings from the environment (paths and names only; the
// push credential comes from a root-only file):
//
//	DBOS_SYSTEM_DATABASE_URL  Postgres, for DBOS and the generation counter
//	SHIM_RUNTIME_DIR          the sandbox's shim runtime dir (its control socket)
//	TASK                      the workflow id: one task, one workflow
//	WORKTREE, BRANCH          the checkout the harness works in, the branch it pushes
//	HARNESS, HARNESS_USER     the agent's command and its uid[:gid]
//	HARNESS_HOME              its HOME
//	CREDENTIAL_FILE           JSON list of api.Credential for the push
//	LEASE                     a Go duration: the generation's lease ("" none)
//	RECOVER                   1: do not start the task, wait for the workflow DBOS recovered
//	AGENT                     "exec": the agent loop runs in the step, here, and its tool
//	                          calls go through exec into an idle generation (agent.go);
//	                          "" (default): the step runs HARNESS as the generation
//	FINISH_FILE               AGENT=exec: the loop finishes its round and ends once this exists
//
// It prints one JSON line per event ("launched", "started", "result") on
// stdout.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// Task is one workflow's input.
type Task struct {
	ID, Worktree, Branch string
	Harness, User, Home  string
	CredentialFile       string
	LeaseMS              int64
	// Agent is "exec" for the agent loop in the step (agent.go).
	Agent, FinishFile string
}

// Outcome is what the harness step returns.
type Outcome struct {
	Generation uint64 `json:"generation"`
	ExitCode   int    `json:"exit_code"`
	Fenced     []int  `json:"fenced"`
	// ToolCalls: AGENT=exec, the tool calls the attempt ran.
	ToolCalls int `json:"tool_calls,omitempty"`
}

var (
	pool *pgxpool.Pool
	shim *client.Client
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "supervisor:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	url := os.Getenv("DBOS_SYSTEM_DATABASE_URL")
	var err error
	if pool, err = pgxpool.New(ctx, url); err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS sandbox_epoch (sandbox text PRIMARY KEY, gen bigint NOT NULL);
		INSERT INTO sandbox_epoch VALUES ('sandbox-1', 0) ON CONFLICT DO NOTHING`); err != nil {
		return err
	}
	shim = client.New(os.Getenv("SHIM_RUNTIME_DIR"))
	task := Task{ID: os.Getenv("TASK"), Worktree: os.Getenv("WORKTREE"), Branch: os.Getenv("BRANCH"),
		Harness: os.Getenv("HARNESS"), User: os.Getenv("HARNESS_USER"), Home: os.Getenv("HARNESS_HOME"),
		CredentialFile: os.Getenv("CREDENTIAL_FILE"), Agent: os.Getenv("AGENT"), FinishFile: os.Getenv("FINISH_FILE")}
	if l := os.Getenv("LEASE"); l != "" {
		d, err := time.ParseDuration(l)
		if err != nil {
			return err
		}
		task.LeaseMS = d.Milliseconds()
	}

	// The settings that matter across deploys: one application version
	// (a recovered workflow runs only where its version matches) and one
	// executor id per sandbox (DBOS recovers the workflows of its own).
	dctx, err := dbos.NewContext(ctx, dbos.Config{AppName: "shim-example", DatabaseURL: url,
		ApplicationVersion: "shim-example-1", ExecutorID: "sandbox-1",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	dbos.RegisterWorkflow(dctx, agentTask)
	if err := dbos.Launch(dctx); err != nil { // recovers this executor's pending workflows
		return err
	}
	defer dbos.Shutdown(dctx, 5*time.Second)
	emit(map[string]any{"event": "launched", "pid": os.Getpid()})
	var h dbos.WorkflowHandle[Outcome]
	if os.Getenv("RECOVER") == "1" {
		// After a restart: Launch has recovered the pending workflow and
		// runs it again; only wait for it.
		h, err = dbos.RetrieveWorkflow[Outcome](dctx, task.ID)
	} else {
		h, err = dbos.RunWorkflow(dctx, agentTask, task, dbos.WithWorkflowID(task.ID))
	}
	if err != nil {
		return err
	}
	out, err := h.GetResult()
	if err != nil {
		return err
	}
	emit(map[string]any{"event": "result", "outcome": out})
	return nil
}

// agentTask is the workflow: one step that runs the harness, or (AGENT=exec)
// the agent loop with its tool calls in an idle generation.
func agentTask(ctx dbos.Context, task Task) (Outcome, error) {
	step := runHarness
	if task.Agent == "exec" {
		step = runAgent
	}
	return dbos.RunAsStep(ctx, func(ctx context.Context) (Outcome, error) { return step(ctx, task) },
		dbos.WithStepName("harness"), dbos.WithStepMaxRetries(3),
		// Superseded is final: another attempt is newer (retrying would
		// fence it back: the ping-pong --if-current exists for).
		dbos.WithStepRetryPredicate(func(err error) bool { return !superseded(err) }))
}

// superseded reports whether shim refused the attempt because a newer
// generation exists.
func superseded(err error) bool {
	switch api.CodeOf(err) {
	case api.CodeStaleGeneration, api.CodeNotCurrent, api.CodeGenerationConflict:
		return true
	}
	return false
}

// runHarness is one attempt of the step: mint a generation, announce it
// (shim fences every older one first), keep its lease, wait for its exit.
func runHarness(ctx context.Context, task Task) (Outcome, error) {
	out, err := announce(ctx, task, []string{task.Harness})
	if err != nil {
		return out, err
	}
	gen := out.Generation
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	leaseErr := make(chan error, 1)
	if task.LeaseMS > 0 {
		go func() { leaseErr <- shim.KeepLease(wctx, gen, time.Duration(task.LeaseMS)*time.Millisecond) }()
	}
	exit, err := shim.Wait(wctx, gen)
	if err != nil {
		select {
		case lerr := <-leaseErr:
			err = errors.Join(err, lerr)
		default:
		}
		return out, err
	}
	out.ExitCode = exit.ExitCode
	return out, nil
}

// announce mints a generation in Postgres, in its own transaction, and
// announces it (shim fences every older one first): running command, or
// idle (command nil) for the tool calls of AGENT=exec.
func announce(ctx context.Context, task Task, command []string) (Outcome, error) {
	var gen uint64
	if err := pool.QueryRow(ctx, `UPDATE sandbox_epoch SET gen = gen + 1 WHERE sandbox = 'sandbox-1' RETURNING gen`).Scan(&gen); err != nil {
		return Outcome{}, err
	}
	creds, err := readCredentials(task.CredentialFile)
	if err != nil {
		return Outcome{}, err
	}
	req := api.StartRequest{Generation: gen, Command: command, Idle: command == nil, User: task.User, Worktree: task.Worktree, Branch: task.Branch,
		Env: []string{"PATH=/usr/bin:/bin", "HOME=" + task.Home, "BRANCH=" + task.Branch, "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@example.invalid", "GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@example.invalid"},
		Credentials: creds, LeaseMS: task.LeaseMS, Labels: map[string]string{"workflow": task.ID, "step": "harness"},
		Fetch: &api.FetchSpec{Branch: task.Branch}}
	res, err := shim.Start(ctx, req)
	if err != nil {
		return Outcome{}, err
	}
	out := Outcome{Generation: gen}
	for _, f := range res.Fenced {
		out.Fenced = append(out.Fenced, int(f.Generation))
	}
	emit(map[string]any{"event": "started", "generation": gen, "baseline": res.Baseline, "started_at": res.StartedAt,
		"fenced": res.Fenced, "durations_ms": res.DurationsMS})
	return out, nil
}

func readCredentials(path string) ([]api.Credential, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cs []api.Credential
	return cs, json.Unmarshal(b, &cs)
}

func emit(v map[string]any) {
	v["at"] = time.Now().UTC()
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}
