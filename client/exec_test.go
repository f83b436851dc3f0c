package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/shimdev/shim/api"
)

// A stream that breaks off before its last frame is STREAM_LOST, with the
// offsets read so far in the Output; Attach with the same Output resumes
// there, and frames that overlap what was delivered are trimmed.
func TestAStreamLostResumesFromItsOffsets(t *testing.T) {
	code := 0
	var attachQuery string
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		if r.Method == "POST" {
			var req api.ExecRequest
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Detach || req.Command[0] != "make" {
				t.Errorf("exec request: %+v %v", req, err)
			}
			enc.Encode(api.Frame{Type: api.FrameStarted, ID: "3", PID: 42})
			enc.Encode(api.Frame{Type: api.FrameStdout, Offset: 0, Data: []byte("hello ")})
			enc.Encode(api.Frame{Type: api.FrameStderr, Offset: 0, Data: []byte("warn\n")})
			return // no last frame: the connection ends early
		}
		attachQuery = r.URL.RawQuery
		enc.Encode(api.Frame{Type: api.FrameStdout, Offset: 3, Data: []byte("lo world")}) // overlaps "lo "
		enc.Encode(api.Frame{Type: api.FrameDropped, Stream: "stdout", Bytes: 10, Offset: 21})
		enc.Encode(api.Frame{Type: api.FrameExit, Process: &api.Process{ID: "3", ExitCode: &code, State: api.ProcessExited}})
	})
	var stdout, stderr bytes.Buffer
	out := &Output{Stdout: &stdout, Stderr: &stderr}
	_, err := c.Exec(context.Background(), 5, api.ExecRequest{Command: []string{"make"}}, out)
	if CodeOf(err) != api.CodeStreamLost || out.ID != "3" || out.StdoutOffset != 6 || out.StderrOffset != 5 {
		t.Fatalf("lost: %v, output %+v", err, out)
	}
	rec, err := c.Attach(context.Background(), 5, out.ID, out, true)
	if err != nil || rec == nil || *rec.ExitCode != 0 {
		t.Fatalf("attach: %+v %v", rec, err)
	}
	if attachQuery != "stdout_offset=6&stderr_offset=5&follow=1" {
		t.Errorf("attach query %q", attachQuery)
	}
	if stdout.String() != "hello world" || stderr.String() != "warn\n" || out.StdoutDropped != 10 || out.StdoutOffset != 21 {
		t.Errorf("stdout %q stderr %q, output %+v", stdout.String(), stderr.String(), out)
	}
}

// A refused exec answers with its code (no stream).
func TestARefusedExecHasItsCode(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		json.NewEncoder(w).Encode(api.Error{Code: api.CodeStaleGeneration, Message: "generation 5 is fenced"})
	})
	if _, err := c.Exec(context.Background(), 5, api.ExecRequest{Command: []string{"true"}}, nil); CodeOf(err) != api.CodeStaleGeneration {
		t.Errorf("exec: %v", err)
	}
}
