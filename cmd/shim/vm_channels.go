package main

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/shimdev/shim/internal/vmchan"
)

// channelWait bounds how long shim looks for a --listen channel's device:
// a virtio-serial port appears when the device tells the driver of it,
// after the module has loaded.
const channelWait = 30 * time.Second

// checkListen validates --listen at parse time.
func checkListen(list []string) error {
	for _, l := range list {
		if _, err := vmchan.ParseListen(l); err != nil {
			return err
		}
	}
	return nil
}

// serveChannels serves the control API on every --listen channel (vsock,
// virtio-serial) until ctx ends, with vmchan.Admit as the admission: the
// host only.
func (p *pid1) serveChannels(ctx context.Context) {
	for _, s := range p.o.listen {
		spec, _ := vmchan.ParseListen(s)
		go func() {
			l, err := openChannel(ctx, spec)
			if err != nil {
				p.log.Error("control channel not served", "listen", spec.String(), "error", err)
				return
			}
			p.log.Info("control channel listening", "listen", spec.String())
			if err := p.rt.ServeListener(ctx, l, vmchan.Admit); err != nil {
				p.log.Error("control channel stopped", "listen", spec.String(), "error", err)
			}
		}()
	}
}

// openChannel opens spec's listener, trying again while its device has
// not appeared, up to channelWait.
func openChannel(ctx context.Context, spec vmchan.Spec) (net.Listener, error) {
	deadline := time.Now().Add(channelWait)
	for {
		var l net.Listener
		var err error
		switch spec.Kind {
		case vmchan.KindVsock:
			l, err = vmchan.ListenVsock(spec.Port)
			if errors.Is(err, vmchan.ErrHostTransport) {
				return nil, err
			}
		default:
			l, err = vmchan.ListenSerial(spec.Name)
		}
		if err == nil || time.Now().After(deadline) {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
