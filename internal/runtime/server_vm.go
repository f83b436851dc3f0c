package runtime

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// ServeListener serves the control API on l, a channel across a VM's
// boundary (internal/vmchan: vsock, virtio-serial), until ctx ends: the
// unix socket's handler and guard, with admit in place of SO_PEERCRED.
// admit decides once per connection, at accept; a refused peer gets
// PEER_NOT_ALLOWED on every request and is audited as on the unix socket
// (pid 0, uid -1: a peer across the boundary has neither here).
func (rt *Runtime) ServeListener(ctx context.Context, l net.Listener, admit func(net.Conn) error) error {
	srv := &http.Server{
		Handler:           rt.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			p := peer{uid: -1}
			if err := admit(c); err != nil {
				p.refused = errs.Wrap(api.CodePeerNotAllowed, err, "peer %v refused", c.RemoteAddr())
			}
			return context.WithValue(ctx, peerKey{}, p)
		},
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err := srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
