package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/shimdev/shim/api"
)

// Output receives a tool call's streamed output (docs/exec.md). Stdout and
// Stderr (either may be nil) get the bytes; Frame, when set, sees every
// frame first (started, dropped...; an error from it ends the stream).
// The offsets advance as frames arrive: after a STREAM_LOST error, Attach
// with the same Output resumes where the stream broke off.
type Output struct {
	Stdout, Stderr io.Writer
	Frame          func(api.Frame) error
	// ID is the call's id, from its started frame.
	ID           string
	StdoutOffset int64
	StderrOffset int64
	// Dropped counts the bytes shim did not keep (past its cap), per
	// stream.
	StdoutDropped, StderrDropped int64
}

// maxFrameLine bounds one frame's line (shim sends at most 32 KiB of data
// a frame, base64: about 44 KiB).
const maxFrameLine = 1 << 20

func genPath(n uint64) string { return "/v1/generations/" + strconv.FormatUint(n, 10) }

// Exec runs a tool call in generation n and streams its output into out
// until it ends. It returns the call's final record (Fenced when its
// generation was fenced; TimedOut when its timeout killed it). A stream
// that breaks off before the end is STREAM_LOST (the call goes on: Attach
// with out resumes it). A refused call is STALE_GENERATION,
// GENERATION_SUSPENDED, TOO_MANY_CALLS, NOT_RUNNING...
func (c *Client) Exec(ctx context.Context, n uint64, req api.ExecRequest, out *Output) (*api.Process, error) {
	req.Detach = false
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	return c.stream(ctx, "POST", genPath(n)+"/processes", bytes.NewReader(b), out)
}

// ExecDetached starts a tool call and returns its record at once; read
// its output with Attach.
func (c *Client) ExecDetached(ctx context.Context, n uint64, req api.ExecRequest) (*api.Process, error) {
	req.Detach = true
	var p api.Process
	return &p, c.do(ctx, "POST", genPath(n)+"/processes", req, &p)
}

// Attach streams call id's output from out's offsets: with follow until
// the call ends (its final record is returned), without it what is kept
// so far (nil record when the call still runs).
func (c *Client) Attach(ctx context.Context, n uint64, id string, out *Output, follow bool) (*api.Process, error) {
	if out == nil {
		out = &Output{}
	}
	out.ID = id
	path := fmt.Sprintf("%s/processes/%s/output?stdout_offset=%d&stderr_offset=%d", genPath(n), id, out.StdoutOffset, out.StderrOffset)
	if follow {
		path += "&follow=1"
	}
	return c.stream(ctx, "GET", path, nil, out)
}

// stream reads frames until the last one.
func (c *Client) stream(ctx context.Context, method, path string, body io.Reader, out *Output) (*api.Process, error) {
	if out == nil {
		out = &Output{}
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://shim"+path, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, outcomeUnknown(method, path, ctx.Err())
		}
		return nil, unreachable("cannot reach shim at %s: %v", c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, decode(resp, nil)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxFrameLine)
	for sc.Scan() {
		var f api.Frame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return nil, &Error{Code: api.CodeInternal, Message: fmt.Sprintf("bad frame: %v", err)}
		}
		if out.Frame != nil {
			if err := out.Frame(f); err != nil {
				return nil, err
			}
		}
		switch f.Type {
		case api.FrameStarted:
			out.ID = f.ID
		case api.FrameStdout:
			if err := deliver(out.Stdout, f, &out.StdoutOffset); err != nil {
				return nil, err
			}
		case api.FrameStderr:
			if err := deliver(out.Stderr, f, &out.StderrOffset); err != nil {
				return nil, err
			}
		case api.FrameDropped:
			if f.Stream == "stderr" {
				out.StderrDropped += f.Bytes
				out.StderrOffset = max(out.StderrOffset, f.Offset)
			} else {
				out.StdoutDropped += f.Bytes
				out.StdoutOffset = max(out.StdoutOffset, f.Offset)
			}
		case api.FrameExit, api.FrameFenced:
			return f.Process, nil
		case api.FrameEnd:
			return nil, nil
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, &Error{Code: api.CodeStreamLost, Message: fmt.Sprintf("the output stream of tool call %q ended early (%v): attach from stdout offset %d, stderr offset %d",
		out.ID, sc.Err(), out.StdoutOffset, out.StderrOffset)}
}

// deliver writes a data frame's bytes past *off (a frame that overlaps
// what was delivered already is trimmed).
func deliver(w io.Writer, f api.Frame, off *int64) error {
	data := f.Data
	if f.Offset < *off {
		skip := *off - f.Offset
		if skip >= int64(len(data)) {
			return nil
		}
		data = data[skip:]
	}
	*off = max(*off, f.Offset) + int64(len(data))
	if w == nil {
		return nil
	}
	_, err := w.Write(data)
	return err
}

// Processes lists generation n's tool calls, oldest first.
func (c *Client) Processes(ctx context.Context, n uint64) ([]api.Process, error) {
	var out []api.Process
	return out, c.do(ctx, "GET", genPath(n)+"/processes", nil, &out)
}

// Process returns tool call id's record.
func (c *Client) Process(ctx context.Context, n uint64, id string) (*api.Process, error) {
	var p api.Process
	return &p, c.do(ctx, "GET", genPath(n)+"/processes/"+id, nil, &p)
}

// SignalProcess signals tool call id: its leader, or with all every
// process of its tree (its cgroup; KILL is cgroup.kill, confirmed).
func (c *Client) SignalProcess(ctx context.Context, n uint64, id, signal string, all bool) error {
	return c.do(ctx, "POST", genPath(n)+"/processes/"+id+"/signal", api.ProcessSignalRequest{Signal: signal, All: all}, nil)
}

// WriteStdin writes data to tool call id's stdin (started with Stdin) and
// returns how much it took: all of it, or STDIN_FULL when the call did
// not read it in time.
func (c *Client) WriteStdin(ctx context.Context, n uint64, id string, data []byte) (int, error) {
	var r api.StdinResult
	err := c.do(ctx, "POST", genPath(n)+"/processes/"+id+"/stdin", api.StdinRequest{Data: data}, &r)
	return r.Written, err
}

// CloseStdin closes tool call id's stdin (on a terminal: sends ^D).
func (c *Client) CloseStdin(ctx context.Context, n uint64, id string) error {
	return c.do(ctx, "POST", genPath(n)+"/processes/"+id+"/stdin", api.StdinRequest{Close: true}, nil)
}

// Resize sets a terminal call's window size.
func (c *Client) Resize(ctx context.Context, n uint64, id string, rows, cols uint16) error {
	return c.do(ctx, "POST", genPath(n)+"/processes/"+id+"/resize", api.ResizeRequest{Rows: rows, Cols: cols}, nil)
}
