package network

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// upstreamQueued is the proxy's view of the send queue of its upstream
// connection to target (0 when there is none).
func upstreamQueued(n *Network, target string) int64 {
	n.proxy.mu.Lock()
	defer n.proxy.mu.Unlock()
	for c, pc := range n.proxy.clients {
		if pc.upstream != nil && pc.target == target {
			return int64(n.proxy.describe(c, pc).SendQueue)
		}
	}
	return 0
}

// TestIsolatedCutAbortsInFlight: an isolated generation has a CONNECT
// tunnel and a plain-HTTP upload to a slow loopback server, both with
// megabytes queued in the proxy's upstream socket, and a child process of
// the generation's cgroup holds a listener and a connection inside the
// generation's namespace. Cut (after the freeze) must
//
//   - report both proxied connections with kind, target, request line
//     (the query and its secret left out), byte counts and the upstream's
//     queue as the kernel saw it, in flight;
//   - abort them on both sides: the server gets ECONNRESET having received
//     nothing beyond what had reached its receive buffer, and the
//     generation's end of the tunnel is reset too;
//   - destroy the generation's own sockets in its namespace (the veth
//     deletion would not) and report them, the listener not in flight, a
//     connected UDP socket too;
//   - time the three parts.
func TestIsolatedCutAbortsInFlight(t *testing.T) {
	requireNetns(t)
	const size = 64 << 20 // more than all the buffers on the way hold
	s := newSink(t)
	n, audit, logs := newTestNetwork(t, 31, ModeIsolated, s.addr())
	g := newTestCgroup(t)

	// The tunnel: the generation writes until something blocks it; the
	// proxy's upstream fills.
	tun, _ := tunnelIn(t, n, s.addr())
	tunErr := make(chan error, 1)
	go func() { _, err := tun.Write(make([]byte, size)); tunErr <- err }()
	tunServer := s.conn(t, 0)
	waitStable(t, "tunnel upstream queue", func() int64 { return upstreamQueued(n, s.addr()) })
	tunQueued := waitStable(t, "sink receive queue (tunnel)", func() int64 { return inq(tunServer) })

	// The upload: plain HTTP with a secret in the query.
	up, err := dialIn(n, n.Info().Proxy, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	upErr := make(chan error, 1)
	go func() {
		_, err := fmt.Fprintf(up, "POST http://user:pw@%s/upload/pack?token=hunter2 HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", s.addr(), s.addr(), size)
		if err == nil {
			_, err = up.Write(make([]byte, size))
		}
		upErr <- err
	}()
	upServer := s.conn(t, 1)
	upQueued := waitStable(t, "sink receive queue (upload)", func() int64 { return inq(upServer) })
	waitFor(t, 10*time.Second, "upload upstream queue", func() bool {
		n.proxy.mu.Lock()
		defer n.proxy.mu.Unlock()
		k := 0
		for c, pc := range n.proxy.clients {
			if pc.upstream != nil && n.proxy.describe(c, pc).SendQueue > 0 {
				k++
			}
		}
		return k == 2
	})

	// A child of the generation, inside its namespace.
	_, out := g.start(t, "loop", nil, n.Run)
	ready := readLine(t, out)
	listen, ok := strings.CutPrefix(ready, "ready ")
	if !ok {
		t.Fatalf("loop child: %s", ready)
	}

	g.freeze(t)
	rep, err := n.Cut(g.id)
	if err != nil {
		t.Fatalf("Cut: %v", err)
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("cut report: %s", b)

	var tunnel, upload *api.Connection
	var sockets []api.Connection
	for i := range rep.Connections {
		c := &rep.Connections[i]
		switch {
		case c.Via == ViaProxy && c.Kind == "connect":
			tunnel = c
		case c.Via == ViaProxy && c.Kind == "http":
			upload = c
		case c.Via == ViaSocket:
			sockets = append(sockets, *c)
		}
	}
	if tunnel == nil || tunnel.Target != s.addr() || tunnel.Request != "CONNECT "+s.addr() || tunnel.Remote != s.addr() ||
		tunnel.State != "established" || tunnel.SendQueue == 0 || tunnel.BytesUp == 0 || tunnel.TCP == nil || !tunnel.InFlight ||
		!strings.HasPrefix(tunnel.Client, "169.254.64.") {
		t.Errorf("tunnel: %+v", tunnel)
	}
	if upload == nil || upload.Target != s.addr() || upload.Request != "POST http://"+s.addr()+"/upload/pack" ||
		upload.SendQueue == 0 || upload.BytesUp == 0 || !upload.InFlight {
		t.Errorf("upload: %+v", upload)
	}
	var listener, established, udp int
	for _, c := range sockets {
		switch {
		case c.Protocol == "udp" && c.State == "established" && c.Remote == "127.0.0.1:9":
			udp++
		case c.State == "listen" && c.Local == listen && !c.InFlight:
			listener++
		case c.State == "established":
			established++
		}
	}
	if listener != 1 || established != 2 || udp != 1 || rep.SocketsDestroyed != 4 {
		t.Errorf("generation sockets: %+v (destroyed %d)", sockets, rep.SocketsDestroyed)
	}
	if rep.TunnelsClosed != 2 || !rep.LinkDeleted || !rep.InFlight || inFlight(rep.Connections) < 2 {
		t.Errorf("report: %+v", rep)
	}
	for _, k := range []string{"tunnels", "connections", "link"} {
		if rep.DurationsMS[k] <= 0 {
			t.Errorf("no duration for %s: %v", k, rep.DurationsMS)
		}
	}
	if left := dumpFor(t, g.id, int(n.ns)); anyLive(left) {
		t.Errorf("generation sockets left after Cut: %+v", left)
	}

	// Both ends of the tunnel were reset; nothing queued reached the server.
	for name, tc := range map[string]struct {
		server *net.TCPConn
		queued int64
	}{"tunnel": {tunServer, tunQueued}, "upload": {upServer, upQueued}} {
		got, err := drain(t, tc.server)
		if !errors.Is(err, syscall.ECONNRESET) || got > tc.queued {
			t.Errorf("%s: server read %d bytes (had %d before the cut) then %v; want at most that, then a reset", name, got, tc.queued, err)
		}
	}
	select {
	case err := <-tunErr:
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Errorf("generation's tunnel write: %v, want a reset", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("generation's tunnel write still blocked after Cut")
	}
	select {
	case err := <-upErr:
		if err == nil {
			t.Error("upload completed")
		}
	case <-time.After(10 * time.Second):
		t.Error("generation's upload still blocked after Cut")
	}
	for _, blob := range [][]byte{b, audit.Bytes(), logs.Bytes()} {
		if strings.Contains(string(blob), "hunter2") || strings.Contains(string(blob), "user:pw") {
			t.Error("a query secret or userinfo reached the report, the audit log or the logs")
		}
	}
}

// TestRequestLine: the report keeps method, scheme, host and path, and
// drops userinfo, query and fragment, where secrets travel.
func TestRequestLine(t *testing.T) {
	for in, want := range map[string]string{
		"http://u:p@example.com/a/b?token=x#frag": "GET http://example.com/a/b",
		"http://example.com:8080/%2Fenc?x":        "GET http://example.com:8080/%2Fenc",
		"http://example.com":                      "GET http://example.com",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := requestLine(&http.Request{Method: "GET", URL: u}); got != want {
			t.Errorf("%s: %q, want %q", in, got, want)
		}
	}
}

// inFlight counts the connections a report says were in flight.
func inFlight(cs []api.Connection) int {
	n := 0
	for _, c := range cs {
		if c.InFlight {
			n++
		}
	}
	return n
}
