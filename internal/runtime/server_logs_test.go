package runtime

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/shimdev/shim/api"
)

func logFrames(t *testing.T, body *bytes.Buffer) []api.Frame {
	t.Helper()
	var out []api.Frame
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		var f api.Frame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			t.Fatalf("frame %q: %v", sc.Text(), err)
		}
		out = append(out, f)
	}
	return out
}

// A generation shim only has the records of: its files and its record's
// dropped counts, ending with end, or when following with how it ended.
func TestLogsOfAGenerationThatIsOverComeFromItsFiles(t *testing.T) {
	f := newFixture(t)
	dir := f.rt.genDir(4)
	os.MkdirAll(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "stdout"), []byte("hello\n"), 0o640)
	os.WriteFile(filepath.Join(dir, "stderr"), nil, 0o640)
	writeJSON(filepath.Join(dir, "generation.json"), api.Generation{Generation: 4, StdoutDropped: 10, Fence: &api.FenceReport{Generation: 4}})
	writeJSON(filepath.Join(dir, "exit.json"), api.Exit{Generation: 4, ExitCode: 137, Fenced: true})

	w := f.call(allowedPeer, "GET", "/v1/generations/4/logs", "")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	got := logFrames(t, w.Body)
	if len(got) != 3 || string(got[0].Data) != "hello\n" || got[1].Type != api.FrameDropped || got[1].Bytes != 10 ||
		got[1].Offset != 16 || got[2].Type != api.FrameEnd {
		t.Fatalf("frames %+v", got)
	}
	got = logFrames(t, f.call(allowedPeer, "GET", "/v1/generations/4/logs?follow=1&stdout_offset=16", "").Body)
	if len(got) != 1 || got[0].Type != api.FrameFenced || got[0].Exit == nil || got[0].Exit.ExitCode != 137 {
		t.Fatalf("followed from the end: %+v", got)
	}
	wantError(t, f.call(allowedPeer, "GET", "/v1/generations/5/logs", ""), 404, api.CodeNotFound, "generation 5")
	wantError(t, f.call(allowedPeer, "GET", "/v1/generations/4/logs?stdout_offset=-1", ""), 400, api.CodeBadRequest, "stdout_offset")
	wantError(t, f.call(allowedPeer, "GET", "/v1/generations/4/logs?follow=yes", ""), 400, api.CodeBadRequest, "follow")
	wantError(t, f.call(allowedPeer, "POST", "/v1/generations/4/logs", ""), 405, api.CodeMethodNotAllowed, "GET")
}

func TestEventsSinceOverTheAPI(t *testing.T) {
	f := newFixture(t)
	wantError(t, f.call(allowedPeer, "GET", "/v1/events?since=x", ""), 400, api.CodeBadRequest, "since")
	wantError(t, f.call(allowedPeer, "GET", "/v1/events?since=1", ""), 400, api.CodeBadRequest, "ahead of the newest event")
}
