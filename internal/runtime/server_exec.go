package runtime

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// streamWriteTimeout bounds one write of frames to a reader: a reader
// that stops reading is dropped after it (its stream ends without a last
// frame; it re-attaches from its offsets), never waited for longer.
const streamWriteTimeout = 30 * time.Second

// frameChunk is the most bytes of output one frame carries.
const frameChunk = 32 << 10

// dropBatch is how many dropped bytes a following reader is told of at
// once while the stream runs.
const dropBatch = 1 << 20

// execRoutes are the exec API's routes (docs/exec.md), one function each.
func (rt *Runtime) execRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/generations/{n}/processes", rt.serveExec)
	mux.HandleFunc("GET /v1/generations/{n}/processes", rt.serveProcesses)
	mux.HandleFunc("GET /v1/generations/{n}/processes/{id}", rt.serveProcess)
	mux.HandleFunc("POST /v1/generations/{n}/processes/{id}/signal", rt.serveProcessSignal)
	mux.HandleFunc("POST /v1/generations/{n}/processes/{id}/stdin", rt.serveProcessStdin)
	mux.HandleFunc("POST /v1/generations/{n}/processes/{id}/resize", rt.serveProcessResize)
	mux.HandleFunc("GET /v1/generations/{n}/processes/{id}/output", rt.serveProcessOutput)
}

// serveExec: POST /v1/generations/{n}/processes: a tool call: streamed, or its record with detach.
func (rt *Runtime) serveExec(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	var req api.ExecRequest
	if err := decodeStrict(r.Body, &req); err != nil {
		writeError(w, err, nil)
		return
	}
	c, err := rt.Exec(n, req)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	if req.Detach {
		writeJSONResponse(w, http.StatusCreated, c.record())
		return
	}
	rec := c.record()
	rt.streamCall(w, r, c, 0, 0, true, &api.Frame{Type: api.FrameStarted, ID: c.id, PID: rec.Pid})
}

// serveProcesses: GET /v1/generations/{n}/processes: generation n's calls' records.
func (rt *Runtime) serveProcesses(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	list, err := rt.Processes(n)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	writeJSONResponse(w, http.StatusOK, list)
}

// serveProcess: GET /v1/generations/{n}/processes/{id}: one call's record.
func (rt *Runtime) serveProcess(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	p, err := rt.Process(n, r.PathValue("id"))
	if err != nil {
		writeError(w, err, nil)
		return
	}
	writeJSONResponse(w, http.StatusOK, p)
}

// serveCallJSON answers a POST on one tool call: n and the call's id from
// the path, the body decoded strictly into a Req, fn's answer as JSON.
func serveCallJSON[Req any](w http.ResponseWriter, r *http.Request, fn func(n uint64, id string, req Req) (any, error)) {
	n, err := genParam(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	var req Req
	if err := decodeStrict(r.Body, &req); err != nil {
		writeError(w, err, nil)
		return
	}
	out, err := fn(n, r.PathValue("id"), req)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	writeJSONResponse(w, http.StatusOK, out)
}

// serveProcessSignal: POST /v1/generations/{n}/processes/{id}/signal: a signal to a call's leader or its whole cgroup.
func (rt *Runtime) serveProcessSignal(w http.ResponseWriter, r *http.Request) {
	serveCallJSON(w, r, func(n uint64, id string, req api.ProcessSignalRequest) (any, error) {
		sig, err := ParseSignal(req.Signal)
		if err == nil {
			err = rt.SignalProcess(n, id, sig, req.All)
		}
		return map[string]any{"generation": n, "id": id, "signal": req.Signal, "all": req.All}, err
	})
}

// serveProcessStdin: POST /v1/generations/{n}/processes/{id}/stdin: a write to a call's stdin, or its close.
func (rt *Runtime) serveProcessStdin(w http.ResponseWriter, r *http.Request) {
	serveCallJSON(w, r, func(n uint64, id string, req api.StdinRequest) (any, error) {
		return rt.WriteStdin(n, id, req)
	})
}

// serveProcessResize: POST /v1/generations/{n}/processes/{id}/resize: a TTY call's window size.
func (rt *Runtime) serveProcessResize(w http.ResponseWriter, r *http.Request) {
	serveCallJSON(w, r, func(n uint64, id string, req api.ResizeRequest) (any, error) {
		return req, rt.Resize(n, id, req)
	})
}

// serveProcessOutput: GET /v1/generations/{n}/processes/{id}/output: a call's output again from byte offsets, following or not.
func (rt *Runtime) serveProcessOutput(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	q := r.URL.Query()
	var offs [2]int64
	for i, k := range []string{"stdout_offset", "stderr_offset"} {
		if v := q.Get(k); v != "" {
			if offs[i], err = strconv.ParseInt(v, 10, 64); err != nil || offs[i] < 0 {
				writeError(w, errs.New(api.CodeBadRequest, "%s must be a byte offset, not %q", k, v), nil)
				return
			}
		}
	}
	follow := q.Get("follow") == "1" || q.Get("follow") == "true"
	c, rec, err := rt.findCall(n, r.PathValue("id"))
	if err != nil {
		writeError(w, err, nil)
		return
	}
	if c == nil {
		c = endedCall(rec)
	}
	rt.streamCall(w, r, c, offs[0], offs[1], follow, nil)
}

// endedCall stands for a call shim no longer holds in memory (its
// generation fenced, or a previous shim's): its streams are its files as
// they are, and its record is final.
func endedCall(rec *api.Process) *call {
	c := &call{id: rec.ID, n: rec.Generation, rec: *rec, done: make(chan struct{})}
	close(c.done)
	ended := func(name, path string, kept, total int64) *callStream {
		s := &callStream{name: name, path: path, kept: kept, total: total, eof: true, changed: make(chan struct{}), eofCh: make(chan struct{})}
		close(s.eofCh)
		return s
	}
	c.stdout = ended("stdout", rec.Stdout, rec.StdoutKept, rec.StdoutBytes)
	if rec.Stderr != "" {
		c.stderr = ended("stderr", rec.Stderr, rec.StderrKept, rec.StderrBytes)
	}
	return c
}

// streamCall writes call c's output as NDJSON frames from the byte
// offsets given: what its files hold, then (follow) what comes, then its
// exit or fenced frame once it ended; without follow an end frame once
// what is kept so far was sent. Every frame is read from the files:
// nothing is buffered for a reader, and a reader that stops reading is
// dropped after streamWriteTimeout.
func (rt *Runtime) streamCall(w http.ResponseWriter, r *http.Request, c *call, outOff, errOff int64, follow bool, first *api.Frame) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	send := func(f *api.Frame) bool {
		rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		return enc.Encode(f) == nil
	}
	flush := func() bool {
		rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
		return rc.Flush() == nil
	}
	if first != nil && (!send(first) || !flush()) {
		return
	}
	curs := openCursors(c, outOff, errOff)
	defer func() {
		for _, cur := range curs {
			if cur.f != nil {
				cur.f.Close()
			}
		}
	}()
	buf := make([]byte, frameChunk)
	for {
		ended := c.ended() // before the pass: what it wrote last is in the files by then
		var waits []<-chan struct{}
		for _, cur := range curs {
			ch, ok := cur.pass(send, buf, ended, follow)
			if !ok {
				return
			}
			waits = append(waits, ch)
		}
		if ended {
			rec := c.record()
			typ := api.FrameExit
			if rec.Fenced {
				typ = api.FrameFenced
			}
			send(&api.Frame{Type: typ, Process: &rec})
			flush()
			return
		}
		if !follow {
			send(&api.Frame{Type: api.FrameEnd})
			flush()
			return
		}
		if !flush() {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-c.done:
		case <-waits[0]:
		case <-waitOr(waits, 1):
		}
	}
}

// callCursor is a reader's place in one of a call's streams.
type callCursor struct {
	s       *callStream
	f       *os.File // nil: the file could not be opened (nothing to send from it)
	off     int64
	dropped int64 // dropped bytes this reader was told of
}

// openCursors opens a call's output files at the reader's offsets.
func openCursors(c *call, outOff, errOff int64) []*callCursor {
	var curs []*callCursor
	for i, s := range []*callStream{c.stdout, c.stderr} {
		if s == nil {
			continue
		}
		cur := &callCursor{s: s, off: []int64{outOff, errOff}[i]}
		if f, err := os.Open(s.path); err == nil {
			cur.f = f
		}
		curs = append(curs, cur)
	}
	return curs
}

// pass sends what cur's file holds past its offset, then the drops it
// owes the reader; it returns the stream's change channel, and false when
// the reader is gone.
func (cur *callCursor) pass(send func(*api.Frame) bool, buf []byte, ended, follow bool) (<-chan struct{}, bool) {
	kept, total, eof, ch := cur.s.state()
	for cur.f != nil && cur.off < kept {
		n, err := cur.f.ReadAt(buf[:min(int64(len(buf)), kept-cur.off)], cur.off)
		if n > 0 {
			if !send(&api.Frame{Type: cur.s.name, Offset: cur.off, Data: buf[:n]}) {
				return ch, false
			}
			cur.off += int64(n)
		}
		if err != nil {
			break
		}
	}
	if cur.off > kept && cur.dropped == 0 {
		cur.dropped = cur.off - kept // a re-attach past the file: already told
	}
	// Drops are told in batches of dropBatch while the stream runs (not a
	// frame per read past the cap), and all at its end.
	if d := total - kept - cur.dropped; d > 0 && cur.off >= kept && (d >= dropBatch || eof || ended || !follow) {
		if !send(&api.Frame{Type: api.FrameDropped, Stream: cur.s.name, Bytes: d, Offset: total}) {
			return ch, false
		}
		cur.dropped += d
	}
	return ch, true
}

// waitOr is waits[i], or a channel that is never ready.
func waitOr(waits []<-chan struct{}, i int) <-chan struct{} {
	if i < len(waits) {
		return waits[i]
	}
	return nil
}
