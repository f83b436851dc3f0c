package runtime

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// logRoutes serves a generation's kept output as a stream of frames:
//
//	GET /v1/generations/{n}/logs?stdout_offset=B&stderr_offset=B&follow=1
func (rt *Runtime) logRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/generations/{n}/logs", rt.serveLogs)
}

func (rt *Runtime) serveLogs(w http.ResponseWriter, r *http.Request) {
	n, err := genParam(r)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	q := r.URL.Query()
	var offsets [2]int64
	for i, name := range []string{"stdout_offset", "stderr_offset"} {
		if offsets[i], err = offsetParam(q.Get(name), name); err != nil {
			writeError(w, err, nil)
			return
		}
	}
	follow, err := boolParam(q.Get("follow"), "follow")
	if err != nil {
		writeError(w, err, nil)
		return
	}
	s, err := rt.logStream(n, follow, offsets)
	if err != nil {
		writeError(w, err, nil)
		return
	}
	streamNDJSON(w, func(emit func(any) error) error {
		return s.run(r.Context(), func(f api.Frame) error { return emit(f) })
	})
}

// logStream is generation n's output from offsets: read from the copies
// still writing it while the generation is known here, else from its
// files and record.
func (rt *Runtime) logStream(n uint64, follow bool, offsets [2]int64) (*frameStream, error) {
	rt.mu.Lock()
	g, live := rt.gens[n]
	rt.mu.Unlock()
	s := &frameStream{Offsets: offsets[:], Follow: follow}
	if live && g.out != nil {
		s.Sources = []streamSource{
			copySource(api.FrameStdout, filepath.Join(g.dir, "stdout"), g.out.stdout),
			copySource(api.FrameStderr, filepath.Join(g.dir, "stderr"), g.out.stderr),
		}
		s.Last = func(ctx context.Context) (api.Frame, error) {
			select {
			case <-g.exited:
			case <-ctx.Done():
				return api.Frame{}, ctx.Err()
			}
			rt.mu.Lock()
			exit := *g.exit
			rt.mu.Unlock()
			return exitFrame(&exit, exit.Fenced), nil
		}
		return s, nil
	}
	rec, err := rt.Generation(n)
	if err != nil {
		return nil, err
	}
	dir := rt.genDir(n)
	s.Sources = []streamSource{
		fileSource(api.FrameStdout, filepath.Join(dir, "stdout"), rec.StdoutDropped),
		fileSource(api.FrameStderr, filepath.Join(dir, "stderr"), rec.StderrDropped),
	}
	s.Last = func(context.Context) (api.Frame, error) {
		return exitFrame(rec.Exit, rec.State == api.GenFenced), nil
	}
	return s, nil
}

// exitFrame ends a generation's followed logs: fenced when a fence ended
// it, else exit (its harness exited on its own).
func exitFrame(exit *api.Exit, fenced bool) api.Frame {
	if fenced || exit != nil && exit.Fenced {
		return api.Frame{Type: api.FrameFenced, Exit: exit}
	}
	return api.Frame{Type: api.FrameExit, Exit: exit}
}

// serveEvents is GET /v1/events[?since=SEQ[&instance=ID]]: without since,
// the events published from now on; with it, those kept after SEQ first
// (instance: the shim that numbered SEQ, checked). A reader
// that falls behind the kept ring gets a gap event (events.go), never a
// silent loss.
func (rt *Runtime) serveEvents(w http.ResponseWriter, r *http.Request) {
	var since *uint64
	if v := r.URL.Query().Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, errs.New(api.CodeBadRequest, "since must be a non-negative integer, not %q", v), nil)
			return
		}
		since = &n
	}
	rd, err := rt.events.reader(since, r.URL.Query().Get("instance"))
	if err != nil {
		writeError(w, err, nil)
		return
	}
	streamNDJSON(w, func(emit func(any) error) error {
		for {
			evs, err := rd.read(r.Context(), 64)
			if err != nil {
				return err
			}
			for _, ev := range evs {
				if err := emit(ev); err != nil {
					return err
				}
			}
		}
	})
}

// streamNDJSON answers 200 with an NDJSON stream: body calls emit for
// each line, which is written and flushed at once.
func streamNDJSON(w http.ResponseWriter, body func(emit func(any) error) error) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	enc := json.NewEncoder(w)
	_ = body(func(v any) error {
		if err := enc.Encode(v); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
}

func offsetParam(v, name string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, errs.New(api.CodeBadRequest, "%s must be a non-negative byte offset, not %q", name, v)
	}
	return n, nil
}

func boolParam(v, name string) (bool, error) {
	switch v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	}
	return false, errs.New(api.CodeBadRequest, "%s must be 1 or 0, not %q", name, v)
}
