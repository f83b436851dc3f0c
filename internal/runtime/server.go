package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// MaxRequestBytes bounds every request body.
const MaxRequestBytes = 1 << 20

// bodyTimeout bounds how long a client may take to send its request body.
const bodyTimeout = 10 * time.Second

type peerKey struct{}

// peer is who is on the other end of a control connection (SO_PEERCRED),
// and whether it may talk to shim. The decision is taken once, at accept:
// re-resolving the pid later would judge whatever process reused it.
type peer struct {
	pid, uid int
	err      error // credentials unavailable
	refused  error // CheckPeer's verdict
}

// Serve serves the control API on the unix socket at path until ctx ends.
// The socket is mode 0600, or 0660 owned by group when group >= 0; either
// way every peer is still checked (uid allowed, not inside a harness).
func (rt *Runtime) Serve(ctx context.Context, path string, group int) error {
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	mode := os.FileMode(0o600)
	if group >= 0 {
		mode = 0o660
		if err := os.Chown(path, 0, group); err != nil {
			l.Close()
			return err
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return err
	}
	var peers sync.Map // net.Conn -> pid
	srv := &http.Server{
		Handler:           rt.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			p := peerOf(c)
			if p.err == nil {
				p.refused = rt.CheckPeer(p.pid, p.uid)
			}
			if p.err == nil && p.refused == nil && p.pid > 0 {
				peers.Store(c, p.pid)
			}
			return context.WithValue(ctx, peerKey{}, p)
		},
		ConnState: func(c net.Conn, s http.ConnState) {
			// A pidns sweep spares allowed, connected peers (the client
			// asking for the fence); refused ones are never spared.
			switch s {
			case http.StateNew:
				if pid, ok := peers.Load(c); ok {
					rt.PeerConnected(pid.(int))
				}
			case http.StateClosed, http.StateHijacked:
				if pid, ok := peers.LoadAndDelete(c); ok {
					rt.PeerGone(pid.(int))
				}
			}
		},
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	err = srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func peerOf(c net.Conn) peer {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{err: fmt.Errorf("not a unix connection")}
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peer{err: err}
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return peer{err: err}
	}
	if cerr != nil {
		return peer{err: cerr}
	}
	return peer{pid: int(cred.Pid), uid: int(cred.Uid)}
}

// allowedMethods lists the methods mux serves r's path with, other than
// the catch-all: the Allow header of a 405. (ServeMux answers a wrong
// method with 405 itself only when no pattern matches every method, and
// "/" does.)
func allowedMethods(mux *http.ServeMux, r *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	return allow
}

// guard checks the peer, bounds the body and turns any panic into a 500.
func (rt *Runtime) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				rt.log.Error("panic in API handler", "panic", v, "stack", string(debug.Stack()))
				writeError(w, errs.New(api.CodeInternal, "internal error"), nil)
			}
		}()
		p, ok := r.Context().Value(peerKey{}).(peer)
		if !ok || p.err != nil || p.refused != nil {
			err := p.refused
			if err == nil {
				err = errs.New(api.CodePeerNotAllowed, "peer credentials unavailable")
			}
			rt.audit.Record("peer_refused", 0, map[string]any{"pid": p.pid, "uid": p.uid, "path": r.URL.Path, "reason": err.Error()}, false)
			w.Header().Set("Connection", "close")
			writeError(w, err, nil)
			return
		}
		// Read the whole (bounded) body under a deadline, then clear it: a
		// read deadline left on the connection would cancel long handlers
		// (wait, events, a fence with a large restore).
		rc := http.NewResponseController(w)
		rc.SetReadDeadline(time.Now().Add(bodyTimeout))
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
		rc.SetReadDeadline(time.Time{})
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				writeError(w, errs.New(api.CodeBadRequest, "request body larger than %d bytes", MaxRequestBytes), nil)
			} else {
				writeError(w, errs.New(api.CodeBadRequest, "read request body: %v", err), nil)
			}
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// DecodeStart decodes a start request strictly: unknown fields, trailing
// data, oversized bodies and invalid values are BAD_REQUEST.
func DecodeStart(r io.Reader) (api.StartRequest, error) {
	var req api.StartRequest
	if err := decodeStrict(r, &req); err != nil {
		return req, err
	}
	if err := validateStart(&req); err != nil {
		return req, err
	}
	if err := validGenerations(req.Generation, req.IfCurrent, req.Worktree); err != nil {
		return req, err
	}
	return req, nil
}

func decodeStrict(r io.Reader, v any) error {
	b, err := io.ReadAll(io.LimitReader(r, MaxRequestBytes+1))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errs.New(api.CodeBadRequest, "request body larger than %d bytes", MaxRequestBytes)
		}
		return errs.New(api.CodeBadRequest, "read request: %v", err)
	}
	if len(b) > MaxRequestBytes {
		return errs.New(api.CodeBadRequest, "request body larger than %d bytes", MaxRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errs.New(api.CodeBadRequest, "malformed JSON: %v", err)
	}
	if dec.More() {
		return errs.New(api.CodeBadRequest, "malformed JSON: data after the object")
	}
	return nil
}

// decodeOptional decodes r's body into v when it has one (an empty body
// leaves v at its zero value: every field of these requests is optional).
func decodeOptional(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decodeStrict(r.Body, v)
}

func genParam(r *http.Request) (uint64, error) {
	n, err := strconv.ParseUint(r.PathValue("n"), 10, 64)
	if err != nil || n == 0 || n > api.MaxGeneration {
		return 0, errs.New(api.CodeBadRequest, "generation must be a positive integer up to %d (2^53-1), not %q", uint64(api.MaxGeneration), r.PathValue("n"))
	}
	return n, nil
}

// ParseSignal accepts "TERM", "SIGTERM" or a number.
func ParseSignal(s string) (unix.Signal, error) {
	if n, err := strconv.Atoi(s); err == nil && n > 0 && n < 65 {
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return sig, nil
	}
	return 0, errs.New(api.CodeBadRequest, "unknown signal %q", s)
}

// httpStatus maps stable codes to HTTP statuses.
func httpStatus(code string) int {
	switch code {
	case api.CodeBadRequest:
		return http.StatusBadRequest
	case api.CodeNotFound:
		return http.StatusNotFound
	case api.CodePeerNotAllowed:
		return http.StatusForbidden
	case api.CodeStaleGeneration, api.CodeGenerationConflict, api.CodeNotRunning, api.CodeGenerationLive, api.CodeNotCurrent,
		api.CodeNotAnnounced, api.CodeGenerationSuspended, api.CodeStdinClosed:
		return http.StatusConflict
	case api.CodeTooManyCalls, api.CodeStdinFull:
		return http.StatusTooManyRequests
	case api.CodeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case api.CodeShuttingDown:
		return http.StatusServiceUnavailable
	case api.CodeUnsupported, api.CodeControllerMissing:
		return http.StatusNotImplemented
	case api.CodeWorktreeRefused:
		return http.StatusUnprocessableEntity
	}
	return http.StatusInternalServerError
}

// errorBody is api.Error plus, for a failed announcement, the reports of
// what was fenced before it failed.
type errorBody struct {
	api.Error
	Fenced []api.FenceReport `json:"fenced,omitempty"`
}

func writeError(w http.ResponseWriter, err error, fenced []api.FenceReport) {
	e := asAPIError(err)
	writeJSONResponse(w, httpStatus(e.Code), errorBody{Error: *e, Fenced: fenced})
}

func writeJSONResponse(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
