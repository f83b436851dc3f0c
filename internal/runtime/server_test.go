package runtime

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// The control API as a supervisor sees it: every route through
// rt.Handler(), the peer check in front of all of them, and the error body
// and HTTP status of each stable code.

// allowedPeer is a supervisor outside shim's pid namespace, as root.
var allowedPeer = peer{pid: 0, uid: 0}

// call sends one request to the API as peer p.
func (f *fixture) call(p peer, method, target, body string) *httptest.ResponseRecorder {
	f.t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	return f.callReq(p, req)
}

func (f *fixture) callReq(p peer, req *http.Request) *httptest.ResponseRecorder {
	req = req.WithContext(context.WithValue(req.Context(), peerKey{}, p))
	w := httptest.NewRecorder()
	f.rt.Handler().ServeHTTP(w, req)
	return w
}

// decode reads a JSON answer, failing the test if it is not one.
func decode[T any](t *testing.T, w *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q, body %s", ct, w.Body)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("answer is not JSON: %v: %s", err, w.Body)
	}
	return v
}

// wantError checks an error answer: its HTTP status, its stable code, and
// a message that contains msg and does not repeat the code.
func wantError(t *testing.T, w *httptest.ResponseRecorder, status int, code, msg string) errorBody {
	t.Helper()
	if w.Code != status {
		t.Errorf("status %d, want %d: %s", w.Code, status, w.Body)
	}
	e := decode[errorBody](t, w)
	if e.Code != code {
		t.Errorf("code %q, want %q: %s", e.Code, code, w.Body)
	}
	if !strings.Contains(e.Message, msg) {
		t.Errorf("message %q does not say %q", e.Message, msg)
	}
	if strings.HasPrefix(e.Message, e.Code) {
		t.Errorf("message repeats the code: %q", e.Message)
	}
	return e
}

func TestEveryStableCodeHasItsHTTPStatus(t *testing.T) {
	for code, want := range map[string]int{
		api.CodeBadRequest:         http.StatusBadRequest,
		api.CodeNotFound:           http.StatusNotFound,
		api.CodePeerNotAllowed:     http.StatusForbidden,
		api.CodeStaleGeneration:    http.StatusConflict,
		api.CodeGenerationConflict: http.StatusConflict,
		api.CodeNotRunning:         http.StatusConflict,
		api.CodeNotAnnounced:       http.StatusConflict,
		api.CodeMethodNotAllowed:   http.StatusMethodNotAllowed,
		api.CodeShuttingDown:       http.StatusServiceUnavailable,
		api.CodeUnsupported:        http.StatusNotImplemented,
		api.CodeControllerMissing:  http.StatusNotImplemented,
		api.CodeWorktreeRefused:    http.StatusUnprocessableEntity,
		api.CodeFenceFailed:        http.StatusInternalServerError,
		api.CodeCutFailed:          http.StatusInternalServerError,
		api.CodeRestoreFailed:      http.StatusInternalServerError,
		api.CodeTokenNotPersisted:  http.StatusInternalServerError,
		api.CodeAuditFailed:        http.StatusInternalServerError,
		api.CodeStartFailed:        http.StatusInternalServerError,
		api.CodeInternal:           http.StatusInternalServerError,
		"SOMETHING_NEW":            http.StatusInternalServerError,
	} {
		if got := httpStatus(code); got != want {
			t.Errorf("%s: %d, want %d", code, got, want)
		}
	}
}

func TestAnErrorBodyHasTheCodeOnceAndTheFencedReports(t *testing.T) {
	for _, tc := range []struct {
		err       error
		status    int
		code, msg string
	}{
		{errs.New(api.CodeNotFound, "no generation 3"), 404, api.CodeNotFound, "no generation 3"},
		{fmt.Errorf("admit: %w", errs.New(api.CodeStaleGeneration, "stale")), 409, api.CodeStaleGeneration, "admit: stale"},
		{errs.Wrap(api.CodeCutFailed, errors.New("link busy"), "cut"), 500, api.CodeCutFailed, "cut: link busy"},
		{&api.Error{Code: api.CodeFenceFailed, Message: "as persisted"}, 500, api.CodeFenceFailed, "as persisted"},
		{errors.New("plain"), 500, api.CodeInternal, "plain"},
	} {
		w := httptest.NewRecorder()
		writeError(w, tc.err, []api.FenceReport{{Generation: 7}})
		e := wantError(t, w, tc.status, tc.code, tc.msg)
		if e.Message != tc.msg {
			t.Errorf("%v: message %q, want %q", tc.err, e.Message, tc.msg)
		}
		if len(e.Fenced) != 1 || e.Fenced[0].Generation != 7 {
			t.Errorf("%v: fenced reports %+v", tc.err, e.Fenced)
		}
	}
	w := httptest.NewRecorder()
	writeError(w, errs.New(api.CodeBadRequest, "x"), nil)
	if strings.Contains(w.Body.String(), "fenced") {
		t.Errorf("an error that fenced nothing names no fenced list: %s", w.Body)
	}
}

func TestHealthAndStatus(t *testing.T) {
	f := newFixture(t)
	w := f.call(allowedPeer, "GET", "/v1/health", "")
	if w.Code != 200 || !decode[map[string]bool](t, w)["ok"] {
		t.Fatalf("health: %d %s", w.Code, w.Body)
	}
	if st := decode[api.Status](t, f.call(allowedPeer, "GET", "/v1/status", "")); st.State != api.StateIdle || st.Generation != 0 || st.Mode != "cgroup2" {
		t.Errorf("idle status: %+v", st)
	}
	f.mustStart(4)
	st := decode[api.Status](t, f.call(allowedPeer, "GET", "/v1/status", ""))
	if st.State != api.StateRunning || st.Generation != 4 || st.Pid != 1004 || st.Current == nil || st.Current.Cgroup != "/fake/gen-4" {
		t.Errorf("running status: %+v", st)
	}
}

func TestStartAndFenceOverHTTP(t *testing.T) {
	f := newFixture(t)
	w := f.call(allowedPeer, "POST", "/v1/generations", `{"generation": 1, "command": ["agent"]}`)
	if w.Code != http.StatusCreated {
		t.Fatalf("start: %d %s", w.Code, w.Body)
	}
	if res := decode[api.StartResult](t, w); res.Generation != 1 || res.Pid != 1001 || res.Cgroup != "/fake/gen-1" {
		t.Errorf("start result: %+v", res)
	}
	// An identical retry gets the same answer; another spec is a conflict.
	if w := f.call(allowedPeer, "POST", "/v1/generations", `{"generation": 1, "command": ["agent"]}`); w.Code != http.StatusCreated {
		t.Errorf("retry: %d %s", w.Code, w.Body)
	}
	wantError(t, f.call(allowedPeer, "POST", "/v1/generations", `{"generation": 1, "command": ["other"]}`),
		409, api.CodeGenerationConflict, "different spec")

	w = f.call(allowedPeer, "POST", "/v1/fence", `{"generation": 3}`)
	if w.Code != 200 {
		t.Fatalf("fence: %d %s", w.Code, w.Body)
	}
	if res := decode[api.FenceResult](t, w); res.Generation != 3 || len(res.Fenced) != 1 || res.Fenced[0].Generation != 1 {
		t.Errorf("fence result: %+v", res)
	}
	wantError(t, f.call(allowedPeer, "POST", "/v1/generations", `{"generation": 2, "command": ["agent"]}`),
		409, api.CodeStaleGeneration, "generation 2 is stale")
	wantError(t, f.call(allowedPeer, "POST", "/v1/fence", `{"generation": 2}`),
		409, api.CodeStaleGeneration, "generation 2 is stale")
}

func TestAFailedFenceAnswersWithItsCodeAndWhatItFenced(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	f.s.group(1).killErr = errs.New(api.CodeFenceFailed, "1 survivor")
	for _, route := range []struct{ path, body string }{
		{"/v1/generations", `{"generation": 2, "command": ["agent"]}`},
		{"/v1/fence", `{"generation": 2}`},
	} {
		e := wantError(t, f.call(allowedPeer, "POST", route.path, route.body), 500, api.CodeFenceFailed, "generation 1 not fenced")
		if len(e.Fenced) != 1 || e.Fenced[0].Generation != 1 || e.Fenced[0].Survivors != 1 || e.Fenced[0].Error == nil {
			t.Errorf("%s: the body must carry the failed fence's report: %+v", route.path, e.Fenced)
		}
	}
	if f.j.index("start 2") >= 0 {
		t.Errorf("a generation started after a failed fence: %q", f.j.all())
	}
}

func TestRequestsAreDecodedStrictly(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct{ path, body, msg string }{
		{"/v1/generations", ``, "malformed JSON"},
		{"/v1/generations", `{"generation": 1, "command": ["x"], "comand": ["y"]}`, `unknown field "comand"`},
		{"/v1/generations", `{"generation": 1, "command": ["x"]} {}`, "data after the object"},
		{"/v1/generations", `{"generation": 1, "command": ["x"]} trailing`, "data after the object"},
		{"/v1/generations", `{"generation": "1", "command": ["x"]}`, "malformed JSON"},
		{"/v1/generations", `{"generation": -1, "command": ["x"]}`, "malformed JSON"},
		{"/v1/generations", `[]`, "malformed JSON"},
		{"/v1/generations", `{"generation": 0, "command": ["x"]}`, "positive integer"},
		{"/v1/generations", `{"generation": 1, "command": [""]}`, "command is required"},
		{"/v1/generations", `{"generation": 1, "command": ["x"], "idle": true}`, "an idle generation has no command"},
		{"/v1/fence", `{"generation": 2, "extra": true}`, "unknown field"},
		{"/v1/fence", `{"generation": 0}`, "positive integer"},
		{"/v1/worktrees", `{"worktree": "/w", "late": true}`, "unknown field"},
		{"/v1/generations/1/signal", `{"signal": "TERM", "pid": 1}`, "unknown field"},
	} {
		wantError(t, f.call(allowedPeer, "POST", tc.path, tc.body), 400, api.CodeBadRequest, tc.msg)
	}
	if f.j.index("start") >= 0 || f.rt.Status().Generation != 0 {
		t.Errorf("a refused request acted: %q", f.j.all())
	}
}

func TestTheFenceRequestIsValidatedBeforeAdmission(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	for _, tc := range []struct{ body, msg string }{
		{`{"generation": 2, "credentials": [{"protocol": "https", "host": "h", "username": "u", "password": "p"}]}`, "credentials need fetch"},
		{`{"generation": 2, "worktree": "w"}`, "absolute path"},
		{`{"generation": 2, "baseline": "main"}`, "baseline needs a worktree"},
		{`{"generation": 2, "worktree": "/w", "baseline": "-x"}`, "invalid baseline"},
		{`{"generation": 2, "fetch": {}}`, "fetch needs a worktree"},
		{`{"generation": 2, "worktree": "/w", "fetch": {"settle_ms": -1}}`, "settle_ms"},
		{`{"generation": 2, "worktree": "/w", "fetch": {"settle_ms": 600001}}`, "settle_ms"},
		{`{"generation": 2, "worktree": "/w", "fetch": {"branch": "-evil"}}`, ""},
		{`{"generation": 2, "worktree": "/w", "fetch": {}, "credentials": [{"protocol": "https", "host": "", "username": "u", "password": "p"}]}`, "credential 0"},
	} {
		wantError(t, f.call(allowedPeer, "POST", "/v1/fence", tc.body), 400, api.CodeBadRequest, tc.msg)
	}
	// Nothing was admitted: generation 1 runs and the token did not move.
	if f.stateOf(1) != stRunning || f.rt.Status().Generation != 1 || f.j.index("freeze") >= 0 {
		t.Errorf("a refused fence acted: %s %q", f.stateOf(1), f.j.all())
	}
	// A valid fetch with credentials is accepted (and fenced).
	w := f.call(allowedPeer, "POST", "/v1/fence", `{"generation": 2, "worktree": "/w", "fetch": {"remote": "origin", "branch": "main", "settle_ms": 600000},
		"credentials": [{"protocol": "https", "host": "git.example", "username": "u", "password": "p"}]}`)
	if w.Code != 200 || f.stateOf(1) != stFenced {
		t.Errorf("valid fence: %d %s", w.Code, w.Body)
	}
}

func TestBodiesAreBoundedAndReadErrorsAreBadRequests(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	// Exactly the limit is accepted.
	body := `{"generation": 2}`
	body += strings.Repeat(" ", MaxRequestBytes-len(body))
	if w := f.call(allowedPeer, "POST", "/v1/fence", body); w.Code != 200 {
		t.Fatalf("a body of exactly MaxRequestBytes: %d %s", w.Code, w.Body)
	}
	// One byte more is refused before it is decoded.
	wantError(t, f.call(allowedPeer, "POST", "/v1/fence", body+" "), 400, api.CodeBadRequest, "larger than 1048576 bytes")
	wantError(t, f.call(allowedPeer, "POST", "/v1/generations", strings.Repeat("x", 4*MaxRequestBytes)), 400, api.CodeBadRequest, "larger than")

	req := httptest.NewRequest("POST", "/v1/fence", io.MultiReader(strings.NewReader(`{"gen`), errReader{}))
	wantError(t, f.callReq(allowedPeer, req), 400, api.CodeBadRequest, "read request body")

	// DecodeStart on its own bounds and reports read errors the same way.
	if _, err := DecodeStart(strings.NewReader(strings.Repeat(" ", MaxRequestBytes+1))); codeOf(err) != api.CodeBadRequest {
		t.Errorf("oversized: %v", err)
	}
	if _, err := DecodeStart(errReader{}); codeOf(err) != api.CodeBadRequest || !strings.Contains(err.Error(), "read request") {
		t.Errorf("read error: %v", err)
	}
	mbr := http.MaxBytesReader(nil, io.NopCloser(strings.NewReader(`{"generation": 1}`)), 4)
	if _, err := DecodeStart(mbr); codeOf(err) != api.CodeBadRequest || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("max bytes: %v", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestUnknownRoutesAreJSONNotFound(t *testing.T) {
	f := newFixture(t)
	for _, r := range []struct{ method, path string }{
		{"GET", "/"}, {"GET", "/v1/nope"}, {"GET", "/v2/status"}, {"DELETE", "/v1/nope"}, {"POST", "/v1/generations/1/nope"},
	} {
		wantError(t, f.call(allowedPeer, r.method, r.path, ""), 404, api.CodeNotFound, "no such endpoint: "+r.method+" "+r.path)
	}
}

// A path that exists, with the wrong method, is a 405 that says which
// methods it takes (Allow), not a 404.
func TestAWrongMethodIsMethodNotAllowed(t *testing.T) {
	f := newFixture(t)
	for _, r := range []struct{ method, path, allow string }{
		{"DELETE", "/v1/status", "GET"},
		{"POST", "/v1/health", "GET"},
		{"GET", "/v1/fence", "POST"},
		{"PUT", "/v1/generations/1", "GET"},
		{"DELETE", "/v1/generations", "GET, POST"},
		{"GET", "/v1/generations/1/end", "POST"},
		{"GET", "/v1/worktrees", "POST"},
		{"POST", "/v1/snapshots", "GET"},
	} {
		w := f.call(allowedPeer, r.method, r.path, "")
		wantError(t, w, 405, api.CodeMethodNotAllowed, r.method+" "+r.path)
		if got := w.Header().Get("Allow"); got != r.allow {
			t.Errorf("%s %s: Allow %q, want %q", r.method, r.path, got, r.allow)
		}
	}
}

func TestEveryRouteRefusesAPeerThatIsNotAllowed(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	harness := peer{pid: 1001, uid: 0}
	harness.refused = f.rt.CheckPeer(harness.pid, harness.uid)
	stranger := peer{pid: 0, uid: 4242}
	stranger.refused = f.rt.CheckPeer(stranger.pid, stranger.uid)
	for _, tc := range []struct {
		name string
		p    peer
		ctx  bool
		msg  string
	}{
		{"harness", harness, true, "harness processes may not control shim"},
		{"uid", stranger, true, "uid 4242 may not control shim"},
		{"no credentials", peer{err: errors.New("no SO_PEERCRED")}, true, "peer credentials unavailable"},
		{"no peer", peer{}, false, "peer credentials unavailable"},
	} {
		for _, r := range []struct{ method, path, body string }{
			{"GET", "/v1/health", ""},
			{"GET", "/v1/status", ""},
			{"POST", "/v1/fence", `{"generation": 2}`},
			{"POST", "/v1/generations", `{"generation": 2, "command": ["x"]}`},
			{"POST", "/v1/generations/1/signal", `{"signal": "KILL"}`},
			{"GET", "/v1/nope", ""},
		} {
			req := httptest.NewRequest(r.method, r.path, strings.NewReader(r.body))
			w := httptest.NewRecorder()
			if tc.ctx {
				req = req.WithContext(context.WithValue(req.Context(), peerKey{}, tc.p))
			}
			f.rt.Handler().ServeHTTP(w, req)
			wantError(t, w, 403, api.CodePeerNotAllowed, tc.msg)
			if w.Header().Get("Connection") != "close" {
				t.Errorf("%s %s: a refused peer's connection must be closed", tc.name, r.path)
			}
		}
	}
	if f.stateOf(1) != stRunning || f.j.index("freeze") >= 0 || f.j.index("start 2") >= 0 {
		t.Fatalf("a refused peer acted: %q", f.j.all())
	}
	// Every refusal is in the audit log, with who and what.
	recs := auditRecords(t, f.dir, "peer_refused")
	if len(recs) != 4*6 {
		t.Fatalf("%d peer_refused records, want %d", len(recs), 4*6)
	}
	if r := recs[0]; r["pid"] != float64(1001) || r["path"] != "/v1/health" || !strings.Contains(fmt.Sprint(r["reason"]), "gen-1") {
		t.Errorf("record: %v", r)
	}
}

// auditRecords are the records of audit.jsonl with the given event.
func auditRecords(t *testing.T, dir, event string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue // an empty log
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if rec["event"] == event {
			out = append(out, rec)
		}
	}
	return out
}

// panicWorktree is a registered worktree whose listing panics.
type panicWorktree struct{ *fakeWorktree }

func (panicWorktree) List(context.Context) ([]api.Snapshot, error) { panic("bug in a handler") }

func TestAPanicInAHandlerIsAnInternalErrorNotACrash(t *testing.T) {
	f := newFixture(t)
	f.rt.worktrees["/w"] = panicWorktree{&fakeWorktree{j: f.j, path: "/w"}}
	e := wantError(t, f.call(allowedPeer, "GET", "/v1/snapshots", ""), 500, api.CodeInternal, "internal error")
	if strings.Contains(e.Message, "bug in a handler") {
		t.Errorf("the panic value leaks to the client: %q", e.Message)
	}
	if w := f.call(allowedPeer, "GET", "/v1/health", ""); w.Code != 200 {
		t.Errorf("the API after a panic: %d", w.Code)
	}
}

func TestRegisterOverHTTP(t *testing.T) {
	f := newFixture(t)
	w := f.call(allowedPeer, "POST", "/v1/worktrees", `{"worktree": "/w", "keep_paths": ["cache"]}`)
	if reg := decode[api.Registration](t, w); w.Code != 200 || reg.Worktree != "/w" || reg.Late {
		t.Fatalf("register: %d %s", w.Code, w.Body)
	}
	wantError(t, f.call(allowedPeer, "POST", "/v1/worktrees", `{"worktree": "w"}`), 400, api.CodeBadRequest, "absolute path")
	wantError(t, f.call(allowedPeer, "POST", "/v1/worktrees", `{}`), 400, api.CodeBadRequest, "absolute path")
	if st := f.rt.Status(); len(st.Worktrees) != 1 || st.Worktrees[0].Worktree != "/w" {
		t.Errorf("status worktrees: %+v", st.Worktrees)
	}
}

func TestGenerationRecordOverHTTP(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, func(r *api.StartRequest) { r.Labels = map[string]string{"task": "t1"} })
	w := f.call(allowedPeer, "GET", "/v1/generations/1", "")
	if rec := decode[api.Generation](t, w); w.Code != 200 || rec.State != api.StateRunning || rec.Labels["task"] != "t1" || rec.Pid != 1001 {
		t.Errorf("record: %d %s", w.Code, w.Body)
	}
	for _, n := range []string{"0", "x", "-1", "1.5", "18446744073709551616"} {
		wantError(t, f.call(allowedPeer, "GET", "/v1/generations/"+n, ""), 400, api.CodeBadRequest, "positive integer")
		wantError(t, f.call(allowedPeer, "GET", "/v1/generations/"+n+"/wait", ""), 400, api.CodeBadRequest, "positive integer")
		wantError(t, f.call(allowedPeer, "POST", "/v1/generations/"+n+"/signal", `{"signal": "TERM"}`), 400, api.CodeBadRequest, "positive integer")
	}
	wantError(t, f.call(allowedPeer, "GET", "/v1/generations/9", ""), 404, api.CodeNotFound, "generation 9 is not known")
	wantError(t, f.call(allowedPeer, "GET", "/v1/generations/9/wait", ""), 404, api.CodeNotFound, "generation 9 has no exit record")
}

func TestWaitOverHTTP(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1, func(r *api.StartRequest) { r.Linger = true })
	f.s.group(1).proc.exit(5)
	w := f.call(allowedPeer, "GET", "/v1/generations/1/wait", "")
	if exit := decode[api.Exit](t, w); w.Code != 200 || exit.ExitCode != 5 || exit.Generation != 1 || exit.Fenced {
		t.Fatalf("wait: %d %s", w.Code, w.Body)
	}

	// A client that goes away ends its wait.
	f.mustStart(2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, "GET", "/v1/generations/2/wait", nil)
	if w := f.callReq(allowedPeer, req); w.Code == 200 {
		t.Errorf("a cancelled wait answered 200: %s", w.Body)
	}

	// A generation adopted from a previous shim (here its cgroup is gone
	// already) ends without an exit status this shim could know.
	f.rt.mu.Lock()
	f.rt.adopted(7, stAdopted)
	f.rt.mu.Unlock()
	if w := f.call(allowedPeer, "GET", "/v1/generations/7/wait", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"unknown": true`) {
		t.Errorf("wait for an adopted generation: %d %s", w.Code, w.Body)
	}
}

func TestSignalOverHTTP(t *testing.T) {
	f := newFixture(t)
	f.mustStart(1)
	child := sleeper(t)
	f.setPid(1, child.Process.Pid)
	w := f.call(allowedPeer, "POST", "/v1/generations/1/signal", `{"signal": "term"}`)
	if w.Code != 200 || decode[map[string]any](t, w)["signal"] != "SIGTERM" {
		t.Fatalf("signal: %d %s", w.Code, w.Body)
	}
	if sig := waitSignal(t, child); sig != unix.SIGTERM {
		t.Errorf("the harness got %v, want SIGTERM", sig)
	}
	wantError(t, f.call(allowedPeer, "POST", "/v1/generations/1/signal", `{"signal": "SIGNOPE"}`), 400, api.CodeBadRequest, `unknown signal "SIGNOPE"`)
	wantError(t, f.call(allowedPeer, "POST", "/v1/generations/1/signal", `{"signal": "99"}`), 400, api.CodeBadRequest, "unknown signal")
	wantError(t, f.call(allowedPeer, "POST", "/v1/generations/1/signal", ``), 400, api.CodeBadRequest, "malformed JSON")
	wantError(t, f.call(allowedPeer, "POST", "/v1/generations/5/signal", `{"signal": "TERM"}`), 409, api.CodeNotRunning, "generation 5 is not running")
}

func TestParseSignalForms(t *testing.T) {
	for in, want := range map[string]unix.Signal{
		"TERM": unix.SIGTERM, "SIGTERM": unix.SIGTERM, "term": unix.SIGTERM, "sigterm": unix.SIGTERM,
		"KILL": unix.SIGKILL, "HUP": unix.SIGHUP, "1": unix.SIGHUP, "64": unix.Signal(64),
	} {
		if got, err := ParseSignal(in); err != nil || got != want {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-9", "65", "SIG", "TERMINATE", " TERM", "9x"} {
		if got, err := ParseSignal(in); codeOf(err) != api.CodeBadRequest {
			t.Errorf("%q: accepted as %v", in, got)
		}
	}
}

// listWorktree is a registered worktree with snapshots.
type listWorktree struct {
	*fakeWorktree
	snaps []api.Snapshot
	err   error
}

func (w listWorktree) List(context.Context) ([]api.Snapshot, error) { return w.snaps, w.err }
func (w listWorktree) Show(_ context.Context, n uint64) (api.Snapshot, error) {
	for _, s := range w.snaps {
		if s.Generation == n {
			return s, nil
		}
	}
	return api.Snapshot{}, errs.New(api.CodeNotFound, "no snapshot of generation %d", n)
}

type snapList struct {
	Worktree  string         `json:"worktree"`
	Snapshots []api.Snapshot `json:"snapshots"`
}

func TestSnapshotsOverHTTP(t *testing.T) {
	f := newFixture(t)
	wantError(t, f.call(allowedPeer, "GET", "/v1/snapshots", ""), 400, api.CodeBadRequest, "0 are registered")
	a := listWorktree{fakeWorktree: &fakeWorktree{j: f.j, path: "/a"},
		snaps: []api.Snapshot{{Generation: 3, Ref: "refs/shim/abandoned/3"}, {Generation: 2, Ref: "refs/shim/abandoned/2"}}}
	f.rt.worktrees["/a"] = a
	// With one worktree registered, it need not be named.
	w := f.call(allowedPeer, "GET", "/v1/snapshots", "")
	if list := decode[snapList](t, w); w.Code != 200 || len(list.Snapshots) != 2 || list.Snapshots[0].Generation != 3 {
		t.Fatalf("list: %d %s", w.Code, w.Body)
	}
	if s := decode[api.Snapshot](t, f.call(allowedPeer, "GET", "/v1/snapshots/2", "")); s.Ref != "refs/shim/abandoned/2" {
		t.Errorf("show: %+v", s)
	}
	wantError(t, f.call(allowedPeer, "GET", "/v1/snapshots/4", ""), 404, api.CodeNotFound, "no snapshot of generation 4")
	wantError(t, f.call(allowedPeer, "GET", "/v1/snapshots/zero", ""), 400, api.CodeBadRequest, "positive integer")

	f.rt.worktrees["/b"] = listWorktree{fakeWorktree: &fakeWorktree{j: f.j, path: "/b"}, err: errs.New(api.CodeWorktreeRefused, ".git points outside")}
	wantError(t, f.call(allowedPeer, "GET", "/v1/snapshots", ""), 400, api.CodeBadRequest, "2 are registered")
	wantError(t, f.call(allowedPeer, "GET", "/v1/snapshots/2", ""), 400, api.CodeBadRequest, "2 are registered")
	wantError(t, f.call(allowedPeer, "GET", "/v1/snapshots?worktree=/b", ""), 422, api.CodeWorktreeRefused, ".git points outside")
	if w := f.call(allowedPeer, "GET", "/v1/snapshots/3?worktree=/a/", ""); w.Code != 200 {
		t.Errorf("a worktree named with a trailing slash: %d %s", w.Code, w.Body)
	}
	wantError(t, f.call(allowedPeer, "GET", "/v1/snapshots?worktree=/c", ""), 404, api.CodeNotFound, "worktree /c is not registered")
}

func TestTheEventStreamCarriesEveryStepAndEndsWithItsClient(t *testing.T) {
	f := newFixture(t)
	ts := httptest.NewUnstartedServer(f.rt.Handler())
	ts.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, peerKey{}, allowedPeer)
	}
	ts.Start()
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// The headers arrive once the subscription is in place: nothing
	// published from here on is missed.
	f.mustStart(1)
	f.mustStart(2)
	var got []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event line %q: %v", sc.Text(), err)
		}
		if ev.Type == api.EventExited {
			continue // published by the reaper's goroutine: its place is not fixed
		}
		got = append(got, fmt.Sprintf("%s %d", ev.Type, ev.Generation))
		if ev.Type == api.EventStarted && ev.Generation == 2 {
			break
		}
	}
	want := []string{"started 1", "fencing 1", "fenced 1", "started 2"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("events %q, want %q", got, want)
	}
	resp.Body.Close()
	ts.Close() // waits for the handler to return: a reader holds only a cursor, nothing is left registered
}

// serve runs rt.Serve on a fresh socket and returns a client for it once
// the socket is listening with its final mode.
func serve(t *testing.T, rt *Runtime, group int) (*http.Client, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "shim-sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "ctl.sock")
	// Serve chmods the socket after listen: its IN_ATTRIB says it is ready.
	want := uint32(0o600)
	if group >= 0 {
		want = 0o660
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_ATTRIB); err != nil {
		t.Fatal(err)
	}
	events := os.NewFile(uintptr(fd), "inotify")
	defer events.Close()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- rt.Serve(ctx, sock, group) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve after its context ended: %v", err)
		}
	})
	ready := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := events.Read(buf)
			if err != nil {
				ready <- err
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
				// Chown and chmod each notify: ready once the socket is as
				// Serve leaves it.
				var st unix.Stat_t
				if name == "ctl.sock" && unix.Stat(sock, &st) == nil && st.Mode&0o777 == want && (group < 0 || int(st.Gid) == group) {
					ready <- nil
					return
				}
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case err := <-served:
		t.Fatalf("Serve ended before listening: %v", err)
	}
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	t.Cleanup(c.CloseIdleConnections)
	return c, sock
}

func TestServeChecksThePeerOfEveryConnectionAtAccept(t *testing.T) {
	me := os.Getpid()
	t.Run("allowed", func(t *testing.T) {
		f := newFixture(t)
		f.rt.cfg.AllowUIDs = []int{os.Getuid()}
		f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, of: map[int]string{me: "shim"}}
		c, sock := serve(t, f.rt, -1)
		if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != 0o600 || st.Mode()&os.ModeSocket == 0 {
			t.Fatalf("socket: %v %v", st.Mode(), err)
		}
		resp, err := c.Get("http://shim/v1/health")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("health: %d", resp.StatusCode)
		}
		// The connection stays open: its pid is a peer a sweep spares.
		if !f.rt.IsPeer(me) {
			t.Error("a connected, allowed peer is not tracked")
		}
	})
	t.Run("harness", func(t *testing.T) {
		f := newFixture(t)
		f.rt.cfg.AllowUIDs = []int{os.Getuid()}
		f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, of: map[int]string{me: "gen-3"}}
		c, _ := serve(t, f.rt, -1)
		resp, err := c.Post("http://shim/v1/fence", "application/json", strings.NewReader(`{"generation": 9}`))
		if err != nil {
			t.Fatal(err)
		}
		var e errorBody
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 403 || e.Code != api.CodePeerNotAllowed || !strings.Contains(e.Message, "inside gen-3") {
			t.Errorf("a peer inside a generation: %d %+v", resp.StatusCode, e)
		}
		if f.rt.IsPeer(me) || f.rt.Status().Generation != 0 {
			t.Error("a refused peer is tracked or acted")
		}
	})
	t.Run("group", func(t *testing.T) {
		f := newFixture(t)
		f.rt.cfg.AllowUIDs = []int{os.Getuid()}
		f.rt.groups = ownGroups{fakeGroups: fakeGroups{f.s}, of: map[int]string{me: ""}}
		gid := os.Getgid()
		if os.Getuid() != 0 {
			// The socket is owned by root and the group: only root can make it so.
			dir := t.TempDir()
			if err := f.rt.Serve(context.Background(), filepath.Join(dir, "ctl.sock"), gid); err == nil {
				t.Error("Serve could not chown the socket and still served")
			}
			return
		}
		c, sock := serve(t, f.rt, gid)
		var st unix.Stat_t
		if err := unix.Stat(sock, &st); err != nil || st.Mode&0o777 != 0o660 || int(st.Gid) != gid || st.Uid != 0 {
			t.Errorf("socket mode %o owner %d:%d %v", st.Mode&0o777, st.Uid, st.Gid, err)
		}
		// Whoever can open it is still checked.
		resp, err := c.Get("http://shim/v1/status")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("status: %d", resp.StatusCode)
		}
	})
	t.Run("no socket dir", func(t *testing.T) {
		f := newFixture(t)
		if err := f.rt.Serve(context.Background(), filepath.Join(f.dir, "no", "such", "ctl.sock"), -1); err == nil {
			t.Error("Serve on a path that cannot exist succeeded")
		}
	})
	if p := peerOf(&net.TCPConn{}); p.err == nil {
		t.Error("a peer of a non-unix connection must have no credentials")
	}
}

// setPid makes generation n's harness the process pid (a real child of the
// test, so that signals reach something).
func (f *fixture) setPid(n uint64, pid int) {
	f.rt.mu.Lock()
	f.rt.gens[n].pid = pid
	f.rt.mu.Unlock()
}
