package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

// A supervisor's mistakes, through shim ctl and the API: none of them
// bricks the sandbox, and the same request gets the same code whatever
// runs.

// apiCall sends one request to shim's control socket and decodes the
// error body (zero when it succeeded).
func apiCall(t *testing.T, s *Shim, method, path, body string) (int, api.Error, http.Header) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return net.Dial("unix", filepath.Join(s.RuntimeDir, "shim.sock"))
	}}}
	req, _ := http.NewRequest(method, "http://shim"+path, strings.NewReader(body))
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var e api.Error
	if resp.StatusCode >= 300 {
		json.NewDecoder(resp.Body).Decode(&e)
	}
	return resp.StatusCode, e, resp.Header
}

// runsStill fails t unless generation n's harness still runs and the
// token is still highest.
func runsStill(t *testing.T, s *Shim, r api.StartResult, highest uint64, after string) {
	t.Helper()
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Generation != highest || st.State != api.StateRunning || st.Pid != r.Pid || countProcs(r.Cgroup) == 0 {
		t.Errorf("after %s: generation %d must still run and the token stay %d: %+v", after, r.Generation, highest, st)
	}
}

func TestMistakeGenerationAboveTwoToThe53IsRefusedByEveryVerb(t *testing.T) {
	s := startShim(t, shimOpts{})
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--", "sleep", "1000")
	for _, n := range []string{"18446744073709551615", "9007199254740992"} {
		for _, args := range [][]string{
			{"start", "--generation", n, "--", "true"},
			{"start", "--generation", "2", "--if-current", n, "--", "true"},
			{"fence", "--generation", n},
			{"end", "--generation", n},
			{"end", "--generation", n, "--force"},
			{"renew", "--generation", n, "--lease", "1s"},
			{"signal", "--generation", n, "TERM"},
			{"wait", "--generation", n},
			{"generation", "--generation", n},
			{"snapshot", "--generation", n, "--worktree", "/w"},
		} {
			_, errs, code := s.Ctl(args...)
			if e := ctlError(t, errs); code != 2 || e.Code != api.CodeBadRequest || !strings.Contains(e.Message, "9007199254740991") {
				t.Errorf("ctl %s: exit %d %+v; want exit 2 BAD_REQUEST naming 2^53-1", strings.Join(args, " "), code, e)
			}
		}
		for _, c := range []struct{ method, path, body string }{
			{"POST", "/v1/generations", `{"generation": ` + n + `, "command": ["true"]}`},
			{"POST", "/v1/fence", `{"generation": ` + n + `}`},
			{"POST", "/v1/generations/" + n + "/end", `{"force": true}`},
		} {
			if status, e, _ := apiCall(t, s, c.method, c.path, c.body); status != 400 || e.Code != api.CodeBadRequest {
				t.Errorf("%s %s: %d %+v", c.method, c.path, status, e)
			}
		}
	}
	runsStill(t, s, r1, 1, "generations above 2^53-1")
	// The sandbox goes on: 2^53-1 is the highest generation there is.
	s.MustCtl(nil, "start", "--generation", "9007199254740991", "--", "sleep", "1000")
}

func TestMistakeEndOfAGenerationNeverAnnounced(t *testing.T) {
	s := startShim(t, shimOpts{})
	var r1 api.StartResult
	s.MustCtl(&r1, "start", "--generation", "1", "--", "sleep", "1000")
	_, errs, code := s.Ctl("end", "--generation", "999")
	if e := ctlError(t, errs); code != 3 || e.Code != api.CodeNotAnnounced || !strings.Contains(e.Message, "--force") {
		t.Fatalf("end 999: exit %d %+v; want exit 3 NOT_ANNOUNCED", code, e)
	}
	if status, e, _ := apiCall(t, s, "POST", "/v1/generations/999/end", ""); status != 409 || e.Code != api.CodeNotAnnounced {
		t.Errorf("POST /v1/generations/999/end: %d %+v", status, e)
	}
	runsStill(t, s, r1, 1, "an end of a generation never announced")
	s.MustCtl(nil, "start", "--generation", "2", "--", "true")

	// Meant: --force keeps the old behaviour.
	var r3 api.StartResult
	s.MustCtl(&r3, "start", "--generation", "3", "--", "sleep", "1000")
	var res api.FenceResult
	s.MustCtl(&res, "end", "--generation", "999", "--force")
	if len(res.Fenced) != 1 || res.Fenced[0].Generation != 3 || countProcs(r3.Cgroup) != 0 {
		t.Fatalf("end 999 --force: %+v", res)
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Generation != 999 {
		t.Errorf("token after a forced end: %d", st.Generation)
	}
}

// mistake is one request and the code (and exit code) it gets whatever
// runs.
type mistake struct {
	name string
	args func(gen int) []string
	code string
	exit int
	// spares: refused before anything, the running generation goes on;
	// otherwise a live older generation may have caused it (a worktree, a
	// command a harness can remove) and is fenced all the same.
	spares bool
}

func TestMistakeGetsTheSameCodeInEveryState(t *testing.T) {
	f := newWTFixture(t)
	notGit := filepath.Join(f.work, "plain")
	if err := os.Mkdir(notGit, 0o755); err != nil {
		t.Fatal(err)
	}
	withBaseline := func(n int, rev string) []string {
		args := f.startArgs(n, "--", "true")
		for i := range args {
			if args[i] == f.baseline {
				args[i] = rev
			}
		}
		return args
	}
	gen := func(n int) string { return strconv.Itoa(n) }
	mistakes := []mistake{
		{"unknown user", func(n int) []string {
			return []string{"start", "--generation", gen(n), "--user", "no-such-user-shim", "--", "true"}
		}, api.CodeBadRequest, 2, true},
		{"cpu max", func(n int) []string {
			return []string{"start", "--generation", gen(n), "--cpu-max", "half", "--", "true"}
		}, api.CodeBadRequest, 2, true},
		{"worktree /", func(n int) []string {
			return []string{"start", "--generation", gen(n), "--worktree", "/", "--", "true"}
		}, api.CodeBadRequest, 2, true},
		{"missing worktree", func(n int) []string {
			return []string{"start", "--generation", gen(n), "--worktree", "/nonexistent-shim-test", "--", "true"}
		}, api.CodeWorktreeRefused, 1, false},
		{"worktree is a file", func(n int) []string {
			return []string{"start", "--generation", gen(n), "--worktree", "/etc/hostname", "--", "true"}
		}, api.CodeWorktreeRefused, 1, false},
		{"worktree not git", func(n int) []string {
			return []string{"start", "--generation", gen(n), "--worktree", notGit, "--", "true"}
		}, api.CodeWorktreeRefused, 1, false},
		{"fence of a missing worktree", func(n int) []string {
			return []string{"fence", "--generation", gen(n), "--worktree", "/nonexistent-shim-test"}
		}, api.CodeWorktreeRefused, 1, false},
		{"unknown command", func(n int) []string {
			return []string{"start", "--generation", gen(n), "--", "no-such-command-shim"}
		}, api.CodeStartFailed, 1, false},
	}
	s := startShim(t, shimOpts{})
	// Nothing runs: each is refused before anything, the token stays.
	for _, m := range mistakes {
		_, errs, code := s.Ctl(m.args(1)...)
		if e := ctlError(t, errs); code != m.exit || e.Code != m.code {
			t.Errorf("%s, nothing running: exit %d %+v; want exit %d %s", m.name, code, e, m.exit, m.code)
		}
	}
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Generation != 0 || st.State != api.StateIdle {
		t.Fatalf("refused requests moved the token: %+v", st)
	}
	// A generation runs: the same code.
	n := 1
	for _, m := range mistakes {
		var r api.StartResult
		s.MustCtl(&r, "start", "--generation", gen(n), "--", "sleep", "1000")
		_, errs, code := s.Ctl(m.args(n + 1)...)
		e := ctlError(t, errs)
		if code != m.exit || e.Code != m.code {
			t.Errorf("%s, generation %d running: exit %d %+v; want exit %d %s", m.name, n, code, e, m.exit, m.code)
		}
		if m.spares {
			runsStill(t, s, r, uint64(n), m.name)
			s.MustCtl(nil, "end", "--generation", gen(n))
		} else if countProcs(r.Cgroup) != 0 || strings.Contains(e.Message, "not fenced") ||
			(m.code == api.CodeWorktreeRefused && !strings.Contains(e.Message, "generation "+gen(n)+" was fenced")) {
			t.Errorf("%s: generation %d must be fenced and the message say so: %+v", m.name, n, e)
		}
		n += 2
	}

	// The baseline is looked up only once nothing older runs: one code,
	// RESTORE_FAILED, in both states (here on a fresh shim).
	s2 := startShim(t, shimOpts{})
	_, errs, code := s2.Ctl(withBaseline(1, "refs/heads/nope")...)
	if e := ctlError(t, errs); code != 4 || e.Code != api.CodeRestoreFailed || !strings.Contains(e.Message, "nothing older was fenced") {
		t.Errorf("unknown baseline, nothing running: exit %d %+v", code, e)
	}
	var r api.StartResult
	s2.MustCtl(&r, "start", "--generation", "2", "--", "sleep", "1000")
	_, errs, code = s2.Ctl(withBaseline(3, "refs/heads/nope")...)
	e := ctlError(t, errs)
	if code != 4 || e.Code != api.CodeRestoreFailed || strings.Contains(e.Message, "not fenced") ||
		!strings.Contains(e.Message, "generation 2 was fenced") {
		t.Errorf("unknown baseline, generation 2 running: exit %d %+v", code, e)
	}
	if countProcs(r.Cgroup) != 0 {
		t.Error("generation 2 must be dead")
	}
	// The same through the API.
	status, ae, _ := apiCall(t, s2, "POST", "/v1/generations", `{"generation": 4, "command": ["true"], "worktree": "/nonexistent-shim-test"}`)
	if status != 422 || ae.Code != api.CodeWorktreeRefused {
		t.Errorf("API, missing worktree: %d %+v", status, ae)
	}
	status, ae, _ = apiCall(t, s2, "POST", "/v1/generations", `{"generation": 4, "command": ["true"], "user": "no-such-user-shim"}`)
	if status != 400 || ae.Code != api.CodeBadRequest {
		t.Errorf("API, unknown user: %d %+v", status, ae)
	}
}

func TestMistakeWrongHTTPMethodIs405(t *testing.T) {
	s := startShim(t, shimOpts{})
	status, e, h := apiCall(t, s, "GET", "/v1/fence", "")
	if status != 405 || e.Code != api.CodeMethodNotAllowed || h.Get("Allow") != "POST" {
		t.Errorf("GET /v1/fence: %d %+v Allow %q", status, e, h.Get("Allow"))
	}
	if status, e, _ := apiCall(t, s, "GET", "/v1/nope", ""); status != 404 || e.Code != api.CodeNotFound {
		t.Errorf("GET /v1/nope: %d %+v", status, e)
	}
}

// A start without --user (the harness runs as root) on layers used to
// dereference the missing user while checking --lower-group: a panic,
// INTERNAL, after the token had moved.
func TestMistakeNoUserOnLayersStarts(t *testing.T) {
	s := startShim(t, shimOpts{args: []string{"--isolation", "auto"}})
	var r api.StartResult
	s.MustCtl(&r, "start", "--generation", "1", "--", "sleep", "1000")
	_, errs, code := s.Ctl("start", "--generation", "2", "--user", "0:65533", "--", "true")
	if e := ctlError(t, errs); code != 2 || e.Code != api.CodeBadRequest || !strings.Contains(e.Message, "--lower-group") {
		t.Errorf("the lower group as a harness's: exit %d %+v", code, e)
	}
	runsStill(t, s, r, 1, "a harness with the lower group")
}
