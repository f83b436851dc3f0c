package runtime

import (
	"context"
	"net/http"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// Handler is the /v1/ API. Every request is checked against its peer's
// credentials first; no input can make it panic the process. One method
// per route: the logs', snapshots' and tool calls' in server_logs.go,
// server_snapshots.go and server_exec.go.
func (rt *Runtime) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, r := range []struct {
		pattern string
		serve   http.HandlerFunc
	}{
		{"GET /v1/health", serveHealth},
		{"GET /v1/status", rt.serveStatus},
		{"POST /v1/generations", rt.serveStart},
		{"POST /v1/fence", rt.serveFence},
		{"POST /v1/generations/{n}/end", rt.serveEnd},
		{"POST /v1/generations/{n}/lease", rt.serveRenew},
		{"POST /v1/worktrees", rt.serveRegister},
		{"GET /v1/generations", rt.serveGenerations},
		{"GET /v1/generations/{n}", rt.serveGeneration},
		{"GET /v1/generations/{n}/wait", rt.serveWait},
		{"POST /v1/generations/{n}/signal", rt.serveSignal},
		{"GET /v1/events", rt.serveEvents},
	} {
		mux.HandleFunc(r.pattern, r.serve)
	}
	rt.logRoutes(mux)
	rt.snapshotRoutes(mux)
	rt.execRoutes(mux)
	mux.HandleFunc("/", serveUnknown(mux))
	return rt.guard(mux)
}

// answer writes res with status, or err with what the announcement fenced
// before it failed.
func answer(w http.ResponseWriter, status int, res any, err error, fenced []api.FenceReport) {
	if err != nil {
		writeError(w, err, fenced)
		return
	}
	writeJSONResponse(w, status, res)
}

// GET /v1/health
func serveHealth(w http.ResponseWriter, _ *http.Request) {
	writeJSONResponse(w, http.StatusOK, map[string]any{"ok": true})
}

// GET /v1/status
func (rt *Runtime) serveStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSONResponse(w, http.StatusOK, rt.Status())
}

// POST /v1/generations: announce and start a generation. A fence runs to
// its end even if the client goes away.
func (rt *Runtime) serveStart(w http.ResponseWriter, r *http.Request) {
	req, err := DecodeStart(r.Body)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	res, err := rt.Start(context.WithoutCancel(r.Context()), req)
	answer(w, http.StatusCreated, res, err, res.FencedReports())
}

// POST /v1/fence: announce a generation without starting one.
func (rt *Runtime) serveFence(w http.ResponseWriter, r *http.Request) {
	var req api.FenceRequest
	if err := decodeStrict(r.Body, &req); err != nil {
		writeError(w, err, nil)
		return
	}
	res, err := rt.Fence(context.WithoutCancel(r.Context()), req)
	answer(w, http.StatusOK, res, err, res.FencedReports())
}

// POST /v1/generations/{n}/end: fence generation n and nothing above it.
func (rt *Runtime) serveEnd(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	var req api.EndRequest
	if err == nil {
		err = decodeOptional(r, &req)
	}
	if err != nil {
		writeError(w, err, nil)
		return
	}
	res, err := rt.End(context.WithoutCancel(r.Context()), n, req)
	answer(w, http.StatusOK, res, err, res.FencedReports())
}

// POST /v1/generations/{n}/lease: renew generation n's lease.
func (rt *Runtime) serveRenew(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	var req api.RenewRequest
	if err == nil {
		err = decodeOptional(r, &req)
	}
	if err != nil {
		writeError(w, err, nil)
		return
	}
	res, err := rt.Renew(n, req)
	answer(w, http.StatusOK, res, err, nil)
}

// POST /v1/worktrees: register a worktree's trusted metadata.
func (rt *Runtime) serveRegister(w http.ResponseWriter, r *http.Request) {
	var req api.RegisterRequest
	if err := decodeStrict(r.Body, &req); err != nil {
		writeError(w, err, nil)
		return
	}
	reg, err := rt.Register(context.WithoutCancel(r.Context()), req)
	answer(w, http.StatusOK, reg, err, nil)
}

// GET /v1/generations[?label=k=v...]
func (rt *Runtime) serveGenerations(w http.ResponseWriter, r *http.Request) {
	labels := map[string]string{}
	for _, l := range r.URL.Query()["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			writeError(w, errs.New(api.CodeBadRequest, "label %q is not k=v", l), nil)
			return
		}
		labels[k] = v
	}
	list, err := rt.Generations(labels)
	answer(w, http.StatusOK, list, err, nil)
}

// GET /v1/generations/{n}
func (rt *Runtime) serveGeneration(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	rec, err := rt.Generation(n)
	answer(w, http.StatusOK, rec, err, nil)
}

// GET /v1/generations/{n}/wait: until generation n's harness exits.
func (rt *Runtime) serveWait(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	exit, err := rt.Wait(r.Context(), n)
	answer(w, http.StatusOK, exit, err, nil)
}

// POST /v1/generations/{n}/signal
func (rt *Runtime) serveSignal(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	var req api.SignalRequest
	if err == nil {
		err = decodeStrict(r.Body, &req)
	}
	var sig unix.Signal
	if err == nil {
		sig, err = ParseSignal(req.Signal)
	}
	if err == nil {
		err = rt.Signal(n, sig, req.All)
	}
	answer(w, http.StatusOK, map[string]any{"generation": n, "signal": unix.SignalName(sig)}, err, nil)
}

// serveUnknown answers a path the API does not have (NOT_FOUND), or one it
// has with another method (METHOD_NOT_ALLOWED, with an Allow header).
func serveUnknown(mux *http.ServeMux) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if allow := allowedMethods(mux, r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, errs.New(api.CodeMethodNotAllowed, "%s %s: the endpoint takes %s", r.Method, r.URL.Path, strings.Join(allow, " or ")), nil)
			return
		}
		writeError(w, errs.New(api.CodeNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path), nil)
	}
}
