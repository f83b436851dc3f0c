package client

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// serve answers the client's requests on a unix socket with h.
func serve(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "shim.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return NewSocket(sock)
}

// A wait that its caller's deadline or cancel ends is WAIT_TIMEOUT (as
// shim ctl wait --timeout), not OUTCOME_UNKNOWN: a wait changes nothing.
// Any other call so ended may have been carried out: OUTCOME_UNKNOWN.
func TestAWaitItsContextEndsIsWaitTimeout(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers: the generation runs on
	})
	for _, end := range []struct {
		name   string
		ctx    func() (context.Context, context.CancelFunc)
		target error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
	} {
		ctx, cancel := end.ctx()
		_, err := c.Wait(ctx, 7)
		cancel()
		if CodeOf(err) != api.CodeWaitTimeout || !errors.Is(err, end.target) {
			t.Errorf("%s: wait: %v (code %s)", end.name, err, CodeOf(err))
		}
		ctx, cancel = end.ctx()
		_, err = c.Start(ctx, api.StartRequest{Generation: 7, Command: []string{"x"}})
		cancel()
		if CodeOf(err) != api.CodeOutcomeUnknown || !errors.Is(err, end.target) {
			t.Errorf("%s: start: %v (code %s)", end.name, err, CodeOf(err))
		}
	}
}

// End says force when asked, and nothing else when not.
func TestEndSendsForce(t *testing.T) {
	var got []map[string]any
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		got = append(got, body)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"generation": 9, "fenced": []}`))
	})
	if _, err := c.End(context.Background(), 9, api.EndRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.End(context.Background(), 9, api.EndRequest{Force: true}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got[0]) != 0 || got[1]["force"] != true {
		t.Errorf("bodies: %v", got)
	}
}
