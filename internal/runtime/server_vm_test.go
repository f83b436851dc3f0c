package runtime

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
)

// TestServeListenerAdmitsPerConnection: a VM channel's listener gets the
// unix socket's handler, and its admission decides every connection: an
// admitted one is answered, a refused one gets PEER_NOT_ALLOWED on every
// route, and the refusal is audited.
func TestServeListenerAdmitsPerConnection(t *testing.T) {
	f := newFixture(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var refuse atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- f.rt.ServeListener(ctx, l, func(net.Conn) error {
			if refuse.Load() {
				return errors.New("vsock peer CID 3 is not the host")
			}
			return nil
		})
	}()
	get := func(path string) *http.Response {
		t.Helper()
		tr := &http.Transport{DisableKeepAlives: true}
		resp, err := (&http.Client{Transport: tr}).Get("http://" + l.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if r := get("/v1/health"); r.StatusCode != 200 {
		t.Fatalf("admitted peer: %d", r.StatusCode)
	}
	refuse.Store(true)
	for _, p := range []string{"/v1/health", "/v1/status"} {
		if r := get(p); r.StatusCode != http.StatusForbidden {
			t.Fatalf("refused peer on %s: %d, want 403", p, r.StatusCode)
		}
	}
	recs := auditRecords(t, f.rt.cfg.RuntimeDir, "peer_refused")
	if len(recs) == 0 {
		t.Fatal("no peer_refused audit record")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ServeListener after its context ended: %v", err)
	}
}
