package network

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// BenchmarkCut times Network.Cut (abort 10 open CONNECT tunnels, destroy
// the generation's sockets, delete and confirm the veth).
func BenchmarkCut(b *testing.B) {
	requireNetns(b)
	echo := echoServer(b, "127.0.0.1:0")
	g := newTestCgroup(b)
	var tunnelsMS, connsMS, linkMS float64
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		n, err := New(uint64(1000+i), Config{Mode: ModeIsolated, Allow: []string{echo}})
		if err != nil {
			b.Fatal(err)
		}
		var conns []net.Conn
		for j := 0; j < 10; j++ {
			c, br := tunnelIn(b, n, echo)
			if err := echoOnce(c, br, "x"); err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		b.StartTimer()
		rep, err := n.Cut(g.id)
		b.StopTimer()
		if err != nil || rep.TunnelsClosed != 10 || !rep.LinkDeleted {
			b.Fatalf("cut: %+v %v", rep, err)
		}
		tunnelsMS += rep.DurationsMS["tunnels"]
		connsMS += rep.DurationsMS["connections"]
		linkMS += rep.DurationsMS["link"]
		for _, c := range conns {
			c.Close()
		}
		n.Close()
	}
	b.ReportMetric(tunnelsMS/float64(b.N), "tunnels_ms/op")
	b.ReportMetric(connsMS/float64(b.N), "connections_ms/op")
	b.ReportMetric(linkMS/float64(b.N), "link_ms/op")
}

// BenchmarkDestroySocketsEmpty times the host-mode call on a cgroup with no
// socket: what every fence of a host-mode generation pays at least.
func BenchmarkDestroySocketsEmpty(b *testing.B) {
	g := newTestCgroup(b)
	for i := 0; i < b.N; i++ {
		if conns, err := DestroySockets(g.id, -1); err != nil || len(conns) != 0 {
			b.Fatal(conns, err)
		}
	}
}

// sinkServer reads exactly size bytes per connection, then writes one byte.
func sinkServer(b *testing.B, size int64) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := io.CopyN(io.Discard, c, size); err == nil {
					_, _ = c.Write([]byte{1})
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// pump writes size bytes to w and waits for the sink's one-byte ack.
func pump(b *testing.B, c net.Conn, br *bufio.Reader, size int64) time.Duration {
	buf := make([]byte, 256<<10)
	start := time.Now()
	for sent := int64(0); sent < size; sent += int64(len(buf)) {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := br.ReadByte(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

// BenchmarkProxyThroughput sends 256 MiB over a direct loopback TCP
// connection and over a CONNECT tunnel from an isolated generation (veth +
// proxy + loopback), in the same run, and reports both rates and their
// ratio (the tunnel copies in counted chunks, each still spliced).
func BenchmarkProxyThroughput(b *testing.B) {
	requireNetns(b)
	const size = 256 << 20
	sink := sinkServer(b, size)
	n, err := New(2000, Config{Mode: ModeIsolated, Allow: []string{sink}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	var direct, proxied time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := net.Dial("tcp", sink)
		if err != nil {
			b.Fatal(err)
		}
		direct += pump(b, d, bufio.NewReader(d), size)
		d.Close()
		c, br := tunnelIn(b, n, sink)
		proxied += pump(b, c, br, size)
		c.Close()
	}
	mbps := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / (1 << 20) }
	b.ReportMetric(mbps(direct), "direct_MiB/s")
	b.ReportMetric(mbps(proxied), "proxy_MiB/s")
	b.ReportMetric(direct.Seconds()/proxied.Seconds(), "proxy/direct")
}
