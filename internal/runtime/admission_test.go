package runtime

import (
	"context"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

// A supervisor's mistake never bricks the sandbox (admission.go).

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
