package runtime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// A supervisor's mistake gets the same answer whatever runs, and never
// bricks the sandbox (admission.go).

// checkShape of the fakes: every worktree and command is there, unless a
// shapeStarter says otherwise.
func (s *fakeStarter) checkShape(api.StartRequest) error { return nil }

// shapeStarter is a starter whose checkShape refuses.
type shapeStarter struct {
	*fakeStarter
	err error
}

func (s shapeStarter) checkShape(api.StartRequest) error { return s.err }

// untouched fails t unless generation 1 still runs, the token is still
// highest and nothing was frozen or started after it.
func (f *fixture) untouched(t *testing.T, highest uint64, what string) {
	t.Helper()
	if f.stateOf(1) != stRunning || f.rt.Status().Generation != highest || f.durable() != highest ||
		f.j.index("freeze") >= 0 || f.j.index("start 2") >= 0 {
		t.Errorf("%s acted: gen 1 %s, token %d/%d, journal %q", what, f.stateOf(1), f.rt.Status().Generation, f.durable(), f.j.all())
	}
}

func TestAGenerationAboveTwoToThe53IsRefusedByEveryVerb(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	const over = "9007199254740992" // 2^53
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/generations", `{"generation": ` + over + `, "command": ["agent"]}`},
		{"POST", "/v1/generations", `{"generation": 18446744073709551615, "command": ["agent"]}`},
		{"POST", "/v1/generations", `{"generation": 2, "command": ["agent"], "if_current": ` + over + `}`},
		{"POST", "/v1/fence", `{"generation": ` + over + `}`},
		{"POST", "/v1/fence", `{"generation": 2, "if_current": ` + over + `}`},
		{"POST", "/v1/generations/" + over + "/end", ``},
		{"POST", "/v1/generations/2/end", `{"if_current": ` + over + `, "force": true}`},
		{"POST", "/v1/generations/" + over + "/lease", `{"lease_ms": 1000}`},
		{"POST", "/v1/generations/" + over + "/signal", `{"signal": "TERM"}`},
		{"GET", "/v1/generations/" + over, ``},
		{"GET", "/v1/generations/" + over + "/wait", ``},
		{"GET", "/v1/snapshots/" + over + "?worktree=/w", ``},
	} {
		w := f.call(allowedPeer, tc.method, tc.path, tc.body)
		if w.Code != 400 || !strings.Contains(w.Body.String(), "9007199254740991") {
			t.Errorf("%s %s %s: %d %s", tc.method, tc.path, tc.body, w.Code, w.Body)
		}
	}
	f.untouched(t, 1, "a generation above 2^53-1")
	// Called in process, the same.
	for _, err := range []error{
		func() error { _, err := f.start(1 << 53); return err }(),
		func() error {
			_, err := f.rt.Fence(context.Background(), api.FenceRequest{Generation: 1 << 53})
			return err
		}(),
		func() error {
			_, err := f.rt.End(context.Background(), 1<<53, api.EndRequest{Force: true})
			return err
		}(),
	} {
		if codeOf(err) != api.CodeBadRequest {
			t.Errorf("in process: %v", err)
		}
	}
	f.untouched(t, 1, "a generation above 2^53-1, in process")
	// 2^53-1 itself is a generation.
	if res := f.mustStart(api.MaxGeneration); res.Generation != api.MaxGeneration || len(res.Fenced) != 1 {
		t.Errorf("start 2^53-1: %+v", res)
	}
}

func TestAnEndOfAGenerationNeverAnnouncedIsRefusedUnlessForced(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	e := wantError(t, f.call(allowedPeer, "POST", "/v1/generations/999/end", ""), 409, api.CodeNotAnnounced, "generation 999 was never announced")
	if !strings.Contains(e.Message, "highest announced is 1") || !strings.Contains(e.Message, "force") {
		t.Errorf("the message does not say what to do: %q", e.Message)
	}
	f.untouched(t, 1, "an end of a generation never announced")
	if recs := auditRecords(t, f.dir, "end_refused"); len(recs) != 1 {
		t.Errorf("the refusal is not in the audit log: %v", recs)
	}
	// The highest announced is not "never announced": it ends.
	f.mustStart(2)
	if _, err := f.rt.End(context.Background(), 2, api.EndRequest{}); err != nil || f.stateOf(2) != stFenced {
		t.Fatalf("end of the highest: %v", err)
	}
	// Forced, today's behaviour: everything fenced, the token moves there.
	f.mustStart(3)
	w := f.call(allowedPeer, "POST", "/v1/generations/999/end", `{"force": true}`)
	if res := decode[api.FenceResult](t, w); w.Code != 200 || len(res.Fenced) != 1 || res.Fenced[0].Generation != 3 {
		t.Fatalf("forced end: %d %s", w.Code, w.Body)
	}
	if f.rt.Status().Generation != 999 || f.durable() != 999 {
		t.Errorf("token after a forced end: %d", f.rt.Status().Generation)
	}
	if _, err := f.start(999); codeOf(err) != api.CodeStaleGeneration {
		t.Errorf("999 after its end: %v", err)
	}
}

// What no harness can sway is refused before anything, with one code
// whether or not a generation runs.
func TestWhatNoHarnessCanSwayIsRefusedBeforeTheFence(t *testing.T) {
	cases := []struct {
		name, code string
		req        func(*api.StartRequest)
	}{
		{"unknown user", api.CodeBadRequest, func(r *api.StartRequest) { r.User = "no-such-user-shim-test" }},
		{"unknown group", api.CodeBadRequest, func(r *api.StartRequest) { r.User = "0:no-such-group-shim-test" }},
		{"cpu max", api.CodeBadRequest, func(r *api.StartRequest) { r.Limits = &api.Limits{CPUMax: "half"} }},
		{"controller", api.CodeControllerMissing, func(r *api.StartRequest) { r.Limits = &api.Limits{CPUMax: "50000 100000"} }},
		{"worktree /", api.CodeBadRequest, func(r *api.StartRequest) { r.Worktree = "/" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			idle := newFixture(t)
			_, err := idle.start(1, tc.req)
			if codeOf(err) != tc.code || idle.rt.Status().Generation != 0 || idle.j.index("start") >= 0 {
				t.Errorf("idle: %v, token %d, %q", err, idle.rt.Status().Generation, idle.j.all())
			}
			f := newFixture(t)
			f.mustStart(1)
			if _, err := f.start(2, tc.req); codeOf(err) != tc.code {
				t.Errorf("with generation 1 running: %v", err)
			}
			f.untouched(t, 1, tc.name)
		})
	}
}

// A worktree that is not there: WORKTREE_REFUSED in every state. With
// nothing live it is refused before anything; a live older generation
// (whose harness may have removed it) is fenced all the same, and its
// restore does not go to the refused worktree.
func TestAWorktreeThatIsNotThereIsRefusedInEveryState(t *testing.T) {
	refused := errs.New(api.CodeWorktreeRefused, "worktree /typo does not exist")
	idle := newFixture(t)
	idle.rt.launch = shapeStarter{idle.s, refused}
	_, err := idle.start(1, withWorktree("/typo", ""))
	if codeOf(err) != api.CodeWorktreeRefused || idle.rt.Status().Generation != 0 || len(idle.j.all()) != 0 {
		t.Errorf("idle: %v, token %d, %q", err, idle.rt.Status().Generation, idle.j.all())
	}
	if _, err := idle.rt.Fence(context.Background(), api.FenceRequest{Generation: 1, Worktree: "/typo"}); codeOf(err) != api.CodeWorktreeRefused ||
		idle.rt.Status().Generation != 0 {
		t.Errorf("idle fence: %v", err)
	}

	f := newFixture(t)
	f.mustStart(1)
	f.rt.launch = shapeStarter{f.s, refused}
	res, err := f.start(2, withWorktree("/typo", "main"))
	if codeOf(err) != api.CodeWorktreeRefused || !strings.Contains(err.Error(), "generation 1 was fenced first") {
		t.Fatalf("live: %v", err)
	}
	if len(res.Fenced) != 1 || f.stateOf(1) != stFenced || f.j.index("start 2") >= 0 || f.j.index("open /typo") >= 0 {
		t.Errorf("gen 1 must be fenced without a restore on /typo, nothing started: %+v %q", res, f.j.all())
	}
	if st := f.rt.Status(); st.State == api.StateFailed || st.Generation != 2 {
		t.Errorf("status: %+v", st)
	}
	// The same generation, with the worktree meant, starts.
	f.rt.launch = f.s
	if res := f.mustStart(2, withWorktree("/w", "main")); len(res.Fenced) != 0 {
		t.Errorf("retry: %+v", res.Fenced)
	}
}

// A command that is not there: START_FAILED in every state; with a live
// older generation the start goes on after the fence (its restore may
// bring the command back) and the launch decides.
func TestACommandThatIsNotThereIsAStartFailureInEveryState(t *testing.T) {
	missing := errs.New(api.CodeStartFailed, "agent: not found on the harness's PATH")
	idle := newFixture(t)
	idle.rt.launch = shapeStarter{idle.s, missing}
	if _, err := idle.start(1); codeOf(err) != api.CodeStartFailed || idle.rt.Status().Generation != 0 || idle.j.index("start") >= 0 {
		t.Errorf("idle: %v %q", err, idle.j.all())
	}
	f := newFixture(t)
	f.mustStart(1)
	f.rt.launch = shapeStarter{f.s, missing}
	if res, err := f.start(2); err != nil || len(res.Fenced) != 1 {
		t.Errorf("there after the restore: %v", err)
	}
	f.s.startErr = missing
	if _, err := f.start(3); codeOf(err) != api.CodeStartFailed || f.stateOf(2) != stFenced {
		t.Errorf("live: %v, gen 2 %s", err, f.stateOf(2))
	}
}

// A baseline that does not resolve is RESTORE_FAILED with or without a
// generation to fence, and after a kill the message never says "not
// fenced".
func TestAnUnknownBaselineIsARestoreFailureInEveryState(t *testing.T) {
	idle := newFixture(t)
	_, err := idle.start(1, withWorktree("/w", "missing"))
	if codeOf(err) != api.CodeRestoreFailed || !strings.Contains(err.Error(), "nothing older was fenced") {
		t.Errorf("idle: %v", err)
	}
	f := newFixture(t)
	f.mustStart(1)
	w := f.call(allowedPeer, "POST", "/v1/generations", `{"generation": 2, "command": ["agent"], "worktree": "/w", "baseline": "missing"}`)
	e := wantError(t, w, 500, api.CodeRestoreFailed, "generation 1 was fenced")
	if strings.Contains(e.Message, "not fenced") || len(e.Fenced) != 1 || e.Fenced[0].Killed == 0 {
		t.Errorf("after the kill: %+v", e)
	}
}

func TestWorktreeShape(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	for _, d := range []string{"repo/.git/objects", "repo/.git/refs", "empty", "bare/.git", "gitfile"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "gitfile/.git"), []byte("gitdir: x\n"), 0o644)
	os.Symlink(repo, filepath.Join(dir, "link"))
	for _, tc := range []struct{ path, err string }{
		{repo, ""},
		{repo + "/", ""},
		{filepath.Join(dir, "gitfile"), ""},
		{filepath.Join(dir, "nope"), "does not exist"},
		{filepath.Join(dir, "file"), "not a directory"},
		{filepath.Join(dir, "empty"), "not a git worktree"},
		{filepath.Join(dir, "bare"), "has no objects directory"},
		{filepath.Join(dir, "link"), "resolves to " + repo},
	} {
		err := worktreeShape(tc.path)
		if tc.err == "" && err != nil || tc.err != "" && (codeOf(err) != api.CodeWorktreeRefused || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%s: %v, want %q", tc.path, err, tc.err)
		}
	}
}

func TestCheckShapeLooksTheCommandUp(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644)
	l := &launcher{}
	for _, tc := range []struct {
		cmd  string
		env  []string
		want string
	}{
		{"sh", nil, ""},
		{"/bin/sh", nil, ""},
		{"no-such-command-shim-test", nil, api.CodeStartFailed},
		{"sh", []string{"PATH=" + dir}, api.CodeStartFailed},
		{filepath.Join(dir, "nope"), nil, api.CodeStartFailed},
		{plain, nil, api.CodeStartFailed},
		{dir, nil, api.CodeStartFailed},
	} {
		err := l.checkShape(api.StartRequest{Command: []string{tc.cmd}, Env: tc.env})
		if codeOf(err) != tc.want {
			t.Errorf("%s %v: %v, want %q", tc.cmd, tc.env, err, tc.want)
		}
	}
	if err := l.checkShape(api.StartRequest{Worktree: filepath.Join(dir, "nope")}); codeOf(err) != api.CodeWorktreeRefused {
		t.Errorf("worktree: %v", err)
	}
}
