// Package client is the Go client of shim's control API, the supported way
// for Go supervisors to announce, fence and watch generations. It speaks
// HTTP/1.1 + JSON over the unix socket <runtime-dir>/shim.sock.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"time"

	"github.com/shimdev/shim/api"
)

// Client talks to one shim.
type Client struct {
	socket string
	hc     *http.Client
}

// New returns a client for the shim whose runtime dir is dir.
func New(dir string) *Client { return NewSocket(filepath.Join(dir, "shim.sock")) }

// NewSocket returns a client for the control socket at path.
func NewSocket(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableCompression: true,
	}
	return &Client{socket: path, hc: &http.Client{Transport: tr}}
}

// Error is a failed call: the API's stable code and message, and for a
// failed announcement the reports of what was fenced before it failed.
type Error struct {
	Code    string            `json:"code"`
	Message string            `json:"message"`
	Fenced  []api.FenceReport `json:"fenced,omitempty"`
	cause   error             // the context's error, for OUTCOME_UNKNOWN and WAIT_TIMEOUT
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Unwrap is the context's error of an OUTCOME_UNKNOWN or a WAIT_TIMEOUT
// (errors.Is(err, context.DeadlineExceeded) holds).
func (e *Error) Unwrap() error { return e.cause }

// outcomeUnknown is a call the caller's context ended: it may have reached
// shim and been carried out.
func outcomeUnknown(method, path string, err error) *Error {
	return &Error{Code: api.CodeOutcomeUnknown, cause: err,
		Message: fmt.Sprintf("%s %s: %v before shim answered; the outcome is unknown: retry with the same generation and spec", method, path, err)}
}

func unreachable(format string, args ...any) *Error {
	return &Error{Code: api.CodeUnreachable, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the stable code of an error returned by this package.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return api.CodeOf(err)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://shim"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return outcomeUnknown(method, path, ctx.Err())
		}
		return unreachable("cannot reach shim at %s: %v", c.socket, err)
	}
	defer resp.Body.Close()
	if err := decode(resp, out); err != nil {
		if ctx.Err() != nil {
			return outcomeUnknown(method, path, ctx.Err())
		}
		return err
	}
	return nil
}

func decode(resp *http.Response, out any) error {
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return unreachable("reading the answer: %v", err)
	}
	if resp.StatusCode >= 300 {
		e := &Error{}
		if json.Unmarshal(b, e) != nil || e.Code == "" {
			e = &Error{Code: api.CodeInternal, Message: fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))}
		}
		return e
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// Health checks that shim answers.
func (c *Client) Health(ctx context.Context) error { return c.do(ctx, "GET", "/v1/health", nil, nil) }

// Status returns shim's state.
func (c *Client) Status(ctx context.Context) (*api.Status, error) {
	var s api.Status
	return &s, c.do(ctx, "GET", "/v1/status", nil, &s)
}

// Start announces a generation: older ones are fenced, then it starts.
func (c *Client) Start(ctx context.Context, req api.StartRequest) (*api.StartResult, error) {
	var r api.StartResult
	return &r, c.do(ctx, "POST", "/v1/generations", req, &r)
}

// Fence fences every generation older than req.Generation.
func (c *Client) Fence(ctx context.Context, req api.FenceRequest) (*api.FenceResult, error) {
	var r api.FenceResult
	return &r, c.do(ctx, "POST", "/v1/fence", req, &r)
}

// Register registers a worktree before any harness runs there (the one
// trusted registration; see api.Registration).
// Generations lists the generations shim keeps a record of whose labels
// hold every k=v of labels (nil: all), oldest first.
func (c *Client) Generations(ctx context.Context, labels map[string]string) ([]api.Generation, error) {
	q := url.Values{}
	for k, v := range labels {
		q.Add("label", k+"="+v)
	}
	path := "/v1/generations"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []api.Generation
	err := c.do(ctx, "GET", path, nil, &out)
	return out, err
}

// End fences generation n itself and starts nothing (api.EndRequest).
func (c *Client) End(ctx context.Context, n uint64, req api.EndRequest) (*api.FenceResult, error) {
	var res api.FenceResult
	err := c.do(ctx, "POST", "/v1/generations/"+strconv.FormatUint(n, 10)+"/end", req, &res)
	return &res, err
}

// Renew renews generation n's lease for lease from now (0: the one it was
// announced with); a suspended generation resumes. STALE_GENERATION means
// a newer generation was announced: this supervisor is superseded.
func (c *Client) Renew(ctx context.Context, n uint64, lease time.Duration) (*api.RenewResult, error) {
	var res api.RenewResult
	err := c.do(ctx, "POST", "/v1/generations/"+strconv.FormatUint(n, 10)+"/lease", api.RenewRequest{LeaseMS: lease.Milliseconds()}, &res)
	return &res, err
}

// KeepLease renews generation n's lease every third of lease until ctx
// ends (it then returns nil) or a renewal is refused (it returns that
// error: STALE_GENERATION, NOT_RUNNING...). A renewal that could not reach
// shim is tried again at the next tick: the lease runs out only if that
// goes on for a whole lease. Run it beside the step that waits for the
// generation.
func (c *Client) KeepLease(ctx context.Context, n uint64, lease time.Duration) error {
	if lease <= 0 {
		// The generation's own: from its record.
		g, err := c.Generation(ctx, n)
		if err != nil {
			return err
		}
		if g.Lease == nil {
			return &Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("generation %d has no lease: give one", n)}
		}
		lease = time.Duration(g.Lease.DurationMS) * time.Millisecond
	}
	t := time.NewTicker(lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, lease/3)
		_, err := c.Renew(rctx, n, lease)
		cancel()
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		if c := CodeOf(err); c == api.CodeUnreachable || c == api.CodeOutcomeUnknown {
			continue
		}
		return err
	}
}

func (c *Client) Register(ctx context.Context, req api.RegisterRequest) (*api.Registration, error) {
	var r api.Registration
	return &r, c.do(ctx, "POST", "/v1/worktrees", req, &r)
}

// Generation returns one generation's record.
func (c *Client) Generation(ctx context.Context, n uint64) (*api.Generation, error) {
	var g api.Generation
	return &g, c.do(ctx, "GET", "/v1/generations/"+strconv.FormatUint(n, 10), nil, &g)
}

// Wait blocks until generation n's harness exits. When ctx ends first the
// error is WAIT_TIMEOUT (errors.Is it with ctx's error holds): a wait
// changes nothing, so its outcome is not unknown; the generation still
// runs, and waiting again is all there is to do.
func (c *Client) Wait(ctx context.Context, n uint64) (*api.Exit, error) {
	var e api.Exit
	err := c.do(ctx, "GET", "/v1/generations/"+strconv.FormatUint(n, 10)+"/wait", nil, &e)
	if ce, ok := err.(*Error); ok && ce.Code == api.CodeOutcomeUnknown {
		return &e, &Error{Code: api.CodeWaitTimeout, cause: ce.cause,
			Message: fmt.Sprintf("generation %d had not exited when the wait ended (%v); it still runs", n, ce.cause)}
	}
	return &e, err
}

// Signal sends a signal ("TERM", "SIGKILL", "9") to generation n's harness,
// or to all of its processes.
func (c *Client) Signal(ctx context.Context, n uint64, signal string, all bool) error {
	return c.do(ctx, "POST", "/v1/generations/"+strconv.FormatUint(n, 10)+"/signal", api.SignalRequest{Signal: signal, All: all}, nil)
}

// Snapshots lists the abandoned-edit snapshots of a worktree ("" = the only one).
func (c *Client) Snapshots(ctx context.Context, worktree string) (*api.SnapshotList, error) {
	var out api.SnapshotList
	return &out, c.do(ctx, "GET", "/v1/snapshots?worktree="+url.QueryEscape(worktree), nil, &out)
}

// Snapshot shows generation n's snapshot of a worktree.
func (c *Client) Snapshot(ctx context.Context, worktree string, n uint64) (*api.Snapshot, error) {
	var out api.Snapshot
	return &out, c.do(ctx, "GET", "/v1/snapshots/"+strconv.FormatUint(n, 10)+"?worktree="+url.QueryEscape(worktree), nil, &out)
}

// Events calls fn for every event published from now on until ctx ends,
// fn returns an error, or shim closes the stream. Each event has a Seq; a
// reader that fell behind gets a gap event for what it missed (see
// EventsSince, which also replays what shim kept).
func (c *Client) Events(ctx context.Context, fn func(api.Event) error) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://shim/v1/events", nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return unreachable("cannot reach shim at %s: %v", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return decode(resp, nil)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return err
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return sc.Err()
}
