package client

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// TestConnectSpecs: unix: and serial: reach a server on a unix socket (a
// VMM's end of a serial port is one), a bad spec is BAD_REQUEST, and a
// hybrid vsock whose VMM is not there is UNREACHABLE.
func TestConnectSpecs(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok": true}`))
	})}
	go srv.Serve(l)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, spec := range []string{"unix:" + sock, "serial:" + sock} {
		c, err := Connect(spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Health(ctx); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
	}
	if _, err := Connect("tcp:127.0.0.1:80"); CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("a bad spec: %v", err)
	}
	c, err := Connect("vsock-uds:" + filepath.Join(t.TempDir(), "none.sock") + ":1024")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Health(ctx); CodeOf(err) != api.CodeUnreachable {
		t.Fatalf("no VMM there: %v", err)
	}
}
