package main

// AGENT=exec: the agent loop runs in the step, in this process, as most
// agent platforms run it (outside the sandbox), and only its tool calls run
// in the sandbox: through shim's exec API, in an idle generation announced
// with the task's lease. Each attempt of the step is a newer generation, so
// when the supervisor dies mid-step and DBOS re-runs the step, announcing
// the new generation fences the old one with every tool call still running
// in it (their whole trees killed, the worktree's edits saved in
// refs/shim/abandoned/N), exactly as it fences a harness.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// watcher is the agent's long-running tool call (a file watcher, a dev
// server): detached from its caller's stream, a setsid grandchild that
// logs every 0.2 s. Only a fence (or the end of the generation) stops it.
const watcher = `setsid sh -c 'while :; do date >> "$HOME/watch-$SHIM_GENERATION.log"; sleep 0.2; done' & exec sleep 100000`

// round is one round of the agent's loop, the tool calls harness.sh makes:
// an edit committed, the branch pushed, an edit left uncommitted.
func round(i int) [][]string {
	n := strconv.Itoa(i)
	return [][]string{
		{"sh", "-c", `echo "gen $SHIM_GENERATION edit $1" >> notes.txt && git add notes.txt && git commit -qm "gen $SHIM_GENERATION edit $1"`, "sh", n},
		{"sh", "-c", `git push -q --force origin "HEAD:$BRANCH"`},
		{"sh", "-c", `echo "gen $SHIM_GENERATION uncommitted $1" > wip.txt`, "sh", n},
	}
}

// runAgent is one attempt of the step with AGENT=exec: announce an idle
// generation (fencing every older one), keep its lease, start the watcher,
// then run rounds of tool calls until FINISH_FILE exists; end the
// generation when done.
func runAgent(ctx context.Context, task Task) (Outcome, error) {
	out, err := announce(ctx, task, nil)
	if err != nil {
		return out, err
	}
	gen := out.Generation
	actx, stop := context.WithCancel(ctx)
	defer stop()
	if task.LeaseMS > 0 {
		go shim.KeepLease(actx, gen, time.Duration(task.LeaseMS)*time.Millisecond)
	}
	if _, err := shim.ExecDetached(actx, gen, api.ExecRequest{Command: []string{"sh", "-c", watcher},
		Labels: map[string]string{"tool": "watcher"}}); err != nil {
		return out, err
	}
	out.ToolCalls++
	for i := 1; ; i++ {
		for _, cmd := range round(i) {
			if err := toolCall(actx, gen, cmd); err != nil {
				return out, err
			}
			out.ToolCalls++
		}
		if _, err := os.Stat(task.FinishFile); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond) // the agent's pace (harness.sh's)
	}
	if _, err := shim.End(ctx, gen, api.EndRequest{IfCurrent: &gen}); err != nil {
		return out, err
	}
	emit(map[string]any{"event": "ended", "generation": gen, "tool_calls": out.ToolCalls})
	return out, nil
}

// toolCall runs one tool call to its end. A call that fails is the agent's
// business (it goes on, as an agent reads the error and carries on); one
// that shim fenced, or refused as stale, means a newer attempt owns the
// sandbox: the step stops with the error (superseded: not retried).
func toolCall(ctx context.Context, gen uint64, cmd []string) error {
	var stderr bytes.Buffer
	rec, err := shim.Exec(ctx, gen, api.ExecRequest{Command: cmd, TimeoutMS: 60_000}, &client.Output{Stderr: &stderr})
	if err != nil {
		return err
	}
	if rec.Fenced {
		return api.Errorf(api.CodeStaleGeneration, "generation %d was fenced during %q", gen, cmd)
	}
	if rec.ExitCode == nil || *rec.ExitCode != 0 {
		fmt.Fprintf(os.Stderr, "supervisor: tool call %q: %+v: %s\n", cmd, rec.ExitCode, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}
