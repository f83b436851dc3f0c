package client

import (
	"context"
	"net"
	"net/http"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/vmchan"
)

// Connect returns a client for the shim that spec names, where the unix
// socket in its runtime dir is out of reach (docs/microvm.md):
//
//	unix:PATH            a control socket (New and NewSocket do the same)
//	vsock:CID:PORT       AF_VSOCK to a guest whose shim runs --listen vsock:PORT
//	vsock-uds:PATH:PORT  Firecracker's hybrid vsock: its unix socket, then CONNECT PORT
//	serial:PATH          the host's unix socket of the guest's virtio-serial port
//	                     (shim --listen serial:NAME); one connection at a time
func Connect(spec string) (*Client, error) {
	s, err := vmchan.ParseConnect(spec)
	if err != nil {
		return nil, &Error{Code: api.CodeBadRequest, Message: err.Error()}
	}
	dial := func(ctx context.Context) (net.Conn, error) {
		switch s.Kind {
		case vmchan.KindVsock:
			return vmchan.DialVsock(ctx, s.CID, s.Port)
		case vmchan.KindVsockUDS:
			return vmchan.DialHybrid(ctx, s.Name, s.Port)
		}
		var d net.Dialer
		return d.DialContext(ctx, "unix", s.Name)
	}
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableCompression: true,
	}
	if s.Kind == vmchan.KindSerial {
		// A serial port is one byte stream: a second connection would
		// wait behind the first, so the transport never opens one.
		tr.MaxConnsPerHost = 1
	}
	return &Client{socket: spec, hc: &http.Client{Transport: tr}}, nil
}
