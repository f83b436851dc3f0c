package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/shimdev/shim/api"
)

// LogsOptions say where a read of a generation's output starts and
// whether it follows the output until the generation is over.
type LogsOptions struct {
	Follow       bool
	StdoutOffset int64 // bytes of stdout already read
	StderrOffset int64
}

// LogsResult is where a read of a generation's output stopped: the offsets
// to re-attach from, and the frame that ended the stream (end, exit or
// fenced; nil when the stream was cut before one).
type LogsResult struct {
	StdoutOffset int64
	StderrOffset int64
	Last         *api.Frame
}

// ErrStreamCut is returned when a stream of frames closed before its last
// frame (shim restarted, the connection broke): read again from the
// offsets of the LogsResult.
var ErrStreamCut = errors.New("the stream ended before its last frame; re-attach from the offsets read")

// maxLine bounds one NDJSON line read (a frame holds at most 32 KiB of
// data, about 43 KiB of base64).
const maxLine = 1 << 20

// Logs reads generation n's kept output (GET /v1/generations/{n}/logs)
// from opts' offsets and calls fn for every frame: stdout and stderr data
// (Data, at Offset), dropped (Bytes of Stream not kept), and the last
// one: end when not following; exit or fenced (with the exit record) when
// following, once the generation is over. It returns where it stopped.
func (c *Client) Logs(ctx context.Context, n uint64, opts LogsOptions, fn func(api.Frame) error) (*LogsResult, error) {
	q := url.Values{}
	q.Set("stdout_offset", strconv.FormatInt(opts.StdoutOffset, 10))
	q.Set("stderr_offset", strconv.FormatInt(opts.StderrOffset, 10))
	if opts.Follow {
		q.Set("follow", "1")
	}
	res := &LogsResult{StdoutOffset: opts.StdoutOffset, StderrOffset: opts.StderrOffset}
	err := c.lines(ctx, "/v1/generations/"+strconv.FormatUint(n, 10)+"/logs?"+q.Encode(), func(line []byte) (bool, error) {
		var f api.Frame
		if err := json.Unmarshal(line, &f); err != nil {
			return false, err
		}
		switch f.Type {
		case api.FrameStdout:
			res.StdoutOffset = f.Offset + int64(len(f.Data))
		case api.FrameStderr:
			res.StderrOffset = f.Offset + int64(len(f.Data))
		case api.FrameDropped:
			if f.Stream == api.FrameStderr {
				res.StderrOffset = f.Offset
			} else {
				res.StdoutOffset = f.Offset
			}
		}
		if err := fn(f); err != nil {
			return false, err
		}
		switch f.Type {
		case api.FrameEnd, api.FrameExit, api.FrameFenced:
			res.Last = &f
			return false, nil
		}
		return true, nil
	})
	if err == nil && res.Last == nil {
		err = ErrStreamCut
	}
	return res, err
}

// LogsTo copies generation n's output to stdout and stderr (either may be
// nil: that stream is skipped) and returns where it stopped. Bytes shim
// did not keep are not written: Logs shows them, as dropped frames.
func (c *Client) LogsTo(ctx context.Context, n uint64, opts LogsOptions, stdout, stderr io.Writer) (*LogsResult, error) {
	return c.Logs(ctx, n, opts, func(f api.Frame) error {
		var w io.Writer
		switch f.Type {
		case api.FrameStdout:
			w = stdout
		case api.FrameStderr:
			w = stderr
		}
		if w == nil {
			return nil
		}
		_, err := w.Write(f.Data)
		return err
	})
}

// EventsAfter is EventsSince after the event last, checked to be of the
// same shim: a shim that restarted since (its sequence numbers start again
// at 1) answers BAD_REQUEST instead of events the reader would misplace;
// read again with EventsSince(ctx, 0, fn).
func (c *Client) EventsAfter(ctx context.Context, last api.Event, fn func(api.Event) error) error {
	return c.events(ctx, "/v1/events?since="+strconv.FormatUint(last.Seq, 10)+"&instance="+url.QueryEscape(last.Instance), fn)
}

// EventsSince calls fn for every event kept after seq since (0: every
// event kept), then for every event published later, until ctx ends, fn
// returns an error, or shim closes the stream. A reader that fell behind
// the events shim keeps (--events-kept) gets an event of type gap (From,
// To, Lost) instead of the events it missed. A since from another shim
// (ahead of its newest event) is BAD_REQUEST.
func (c *Client) EventsSince(ctx context.Context, since uint64, fn func(api.Event) error) error {
	return c.events(ctx, "/v1/events?since="+strconv.FormatUint(since, 10), fn)
}

func (c *Client) events(ctx context.Context, path string, fn func(api.Event) error) error {
	err := c.lines(ctx, path, func(line []byte) (bool, error) {
		var ev api.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return false, err
		}
		return true, fn(ev)
	})
	if err == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// lines GETs path and calls line for every NDJSON line until it returns
// false or an error, the stream ends, or ctx ends (its error).
func (c *Client) lines(ctx context.Context, path string, line func([]byte) (bool, error)) error {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://shim"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return unreachable("cannot reach shim at %s: %v", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return decode(resp, nil)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		more, err := line(sc.Bytes())
		if err != nil || !more {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%w: %v", ErrStreamCut, err)
	}
	return nil
}
