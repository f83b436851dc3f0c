package integration

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
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
}
