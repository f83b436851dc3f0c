package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/shimdev/shim/api"
)

func ndjson(w http.ResponseWriter, vs ...any) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for _, v := range vs {
		enc.Encode(v)
	}
}

// Logs tracks the offsets to re-attach from, writes each stream to its
// writer, and returns the last frame; a stream cut before one is
// ErrStreamCut, with the offsets read so far.
func TestLogsTracksOffsetsAndTheLastFrame(t *testing.T) {
	var query string
	cut := false
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		fr := []any{
			api.Frame{Type: api.FrameStdout, Offset: 3, Data: []byte("out")},
			api.Frame{Type: api.FrameStderr, Offset: 0, Data: []byte("err")},
			api.Frame{Type: api.FrameDropped, Stream: "stdout", Bytes: 94, Offset: 100},
		}
		if !cut {
			fr = append(fr, api.Frame{Type: api.FrameExit, Exit: &api.Exit{ExitCode: 2}})
		}
		ndjson(w, fr...)
	})
	var out, errb bytes.Buffer
	res, err := c.LogsTo(context.Background(), 5, LogsOptions{Follow: true, StdoutOffset: 3}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if query != "follow=1&stderr_offset=0&stdout_offset=3" {
		t.Errorf("query %q", query)
	}
	if out.String() != "out" || errb.String() != "err" {
		t.Errorf("stdout %q stderr %q", out.String(), errb.String())
	}
	if res.StdoutOffset != 100 || res.StderrOffset != 3 || res.Last == nil || res.Last.Exit.ExitCode != 2 {
		t.Errorf("result %+v", res)
	}
	cut = true
	res, err = c.Logs(context.Background(), 5, LogsOptions{}, func(api.Frame) error { return nil })
	if !errors.Is(err, ErrStreamCut) || res.StdoutOffset != 100 || res.Last != nil {
		t.Errorf("cut: %v %+v", err, res)
	}
}

func TestEventsSinceAsksForTheSeqAndPassesTheGap(t *testing.T) {
	var query string
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		ndjson(w, api.Event{Type: api.EventGap, From: 8, To: 9, Lost: 2}, api.Event{Seq: 10, Type: api.EventStarted, Generation: 3})
	})
	var got []api.Event
	if err := c.EventsSince(context.Background(), 7, func(ev api.Event) error { got = append(got, ev); return nil }); err != nil {
		t.Fatal(err)
	}
	if query != "since=7" || len(got) != 2 || got[0].Lost != 2 || got[1].Seq != 10 {
		t.Errorf("query %q events %+v", query, got)
	}
	if err := c.EventsAfter(context.Background(), api.Event{Seq: 10, Instance: "ab cd"}, func(api.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if query != "since=10&instance=ab+cd" {
		t.Errorf("after: query %q", query)
	}
	c = serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(api.Error{Code: api.CodeBadRequest, Message: "since 99 is ahead"})
	})
	if err := c.EventsSince(context.Background(), 99, func(api.Event) error { return nil }); CodeOf(err) != api.CodeBadRequest {
		t.Errorf("since ahead: %v", err)
	}
}
