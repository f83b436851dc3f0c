package runtime

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

// FuzzDecodeStart feeds arbitrary bodies to the start request decoder: it
// must never panic, must answer every rejection with BAD_REQUEST, and what it
// accepts must satisfy the request's invariants and survive a round trip.
func FuzzDecodeStart(f *testing.F) {
	for _, s := range []string{
		`{"generation": 1, "command": ["sleep", "1"]}`,
		`{"generation": 2, "command": ["sh"], "env": ["A=B"], "network": "isolated", "allow": ["example.com:443"]}`,
		`{"generation": 3, "command": ["x"], "worktree": "/w", "baseline": "HEAD", "credentials": [{"protocol": "https", "host": "h", "username": "u", "password": "p"}]}`,
		`{"generation": 18446744073709551615, "command": [""]}`,
		`{"generation": 1, "command": ["x"], "limits": {"memory_max": -1}}`,
		`{"generation": 1, "command": ["x"]} {}`,
		`{"generation": 4}`, `{"generation": 5, "idle": true}`, `{"generation": 6, "idle": true, "command": ["x"]}`,
		`[]`, `null`, `{`, "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := DecodeStart(bytes.NewReader(body))
		if err != nil {
			if code := api.CodeOf(err); code != api.CodeBadRequest {
				t.Fatalf("rejection with code %s: %v", code, err)
			}
			return
		}
		// An idle generation has no command (one without a command is
		// made idle); any other has one whose first word is not empty.
		if req.Generation == 0 || req.Idle != (len(req.Command) == 0) || !req.Idle && req.Command[0] == "" {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
		switch req.Network {
		case api.NetworkHost, api.NetworkNone, api.NetworkIsolated:
		default:
			t.Fatalf("accepted network %q", req.Network)
		}
		for _, kv := range req.Env {
			if !strings.Contains(kv, "=") {
				t.Fatalf("accepted env %q", kv)
			}
		}
		// Round trip.
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeStart(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("re-decoding an accepted request: %v\n%s", err, b)
		}
		if specHash(again) != specHash(req) {
			t.Fatalf("round trip changed the request")
		}
	})
}

// FuzzDecodeExec feeds arbitrary bodies to the exec request's decoding and
// validation (what POST /v1/generations/{n}/processes does before anything
// runs): never a panic, every rejection BAD_REQUEST, and what is accepted
// keeps the request's invariants.
func FuzzDecodeExec(f *testing.F) {
	for _, s := range []string{
		`{"command": ["true"]}`,
		`{"command": ["sh", "-c", "x"], "env": ["A=B"], "cwd": "/w", "stdin": true, "stdin_data": "aGk=", "timeout_ms": 5}`,
		`{"command": ["bash"], "tty": true, "rows": 24, "cols": 80, "labels": {"k": "v"}, "detach": true}`,
		`{"command": [""]}`, `{"command": ["x"], "env": ["=x"]}`, `{"command": ["x"], "rows": 3}`,
		`{"command": ["x"], "timeout_ms": -1}`, `{"command": ["x"], "cwd": "rel"}`, `{"command": ["x"]} {}`,
		`[]`, `null`, `{`, "\x00",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req api.ExecRequest
		err := decodeStrict(bytes.NewReader(body), &req)
		if err == nil {
			err = validateExec(&req)
		}
		if err != nil {
			if code := api.CodeOf(err); code != api.CodeBadRequest {
				t.Fatalf("rejection with code %s: %v", code, err)
			}
			return
		}
		if len(req.Command) == 0 || req.Command[0] == "" || req.TimeoutMS < 0 ||
			req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") || !req.TTY && (req.Rows != 0 || req.Cols != 0) {
			t.Fatalf("accepted an invalid request: %+v", req)
		}
		for _, kv := range req.Env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				t.Fatalf("accepted env %q", kv)
			}
		}
	})
}
