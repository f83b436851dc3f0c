package runtime

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/shimdev/shim/api"
)

// maxFrameData bounds the bytes of one data frame (about 43 KiB of base64
// on its line): every client reads a frame with one line read.
const maxFrameData = 32 << 10

// streamState is where one capped output stream is (cappedCopy): its file
// holds the first Kept bytes of the stream, the Dropped bytes after them
// were not kept, and Done says nothing more will come.
type streamState struct {
	Kept    int64
	Dropped int64
	Done    bool
}

// streamSource is one output stream a frameStream reads: its name
// ("stdout", "stderr": the data frames' type), its file, and its state
// with a channel closed at its next change (nil once it is done).
type streamSource struct {
	Name  string
	Path  string
	State func() (streamState, <-chan struct{})
}

// fileSource is a stream that is over: its file and what was dropped of it.
func fileSource(name, path string, dropped int64) streamSource {
	return streamSource{Name: name, Path: path, State: func() (streamState, <-chan struct{}) {
		var kept int64
		if fi, err := os.Stat(path); err == nil {
			kept = fi.Size()
		}
		return streamState{Kept: kept, Dropped: dropped, Done: true}, nil
	}}
}

// copySource is a stream a cappedCopy is still writing (or wrote).
func copySource(name, path string, c *cappedCopy) streamSource {
	return streamSource{Name: name, Path: path, State: c.state}
}

// frameStream streams capped output files as api.Frames from byte offsets:
// what is in the files, a dropped frame where bytes were not kept, then,
// when not following, an end frame; when following, it waits for more
// until every source is done and then writes the frame Last returns (exit,
// fenced). It reads the files, never the pipes: any number of readers,
// each at its own pace, cost shim nothing but their connection, and one
// that disconnects resumes from the offsets it has read. It is the one
// reader of kept output, for a generation's logs and a tool call's.
type frameStream struct {
	Sources []streamSource // at most two (stdout, stderr)
	Offsets []int64        // where each source is read from; moved as frames are written
	Follow  bool
	// Last is the frame that ends a followed stream, once every source is
	// done and read; it may wait (for the exit record). nil: an end frame.
	Last func(ctx context.Context) (api.Frame, error)
}

// run writes the frames to emit until the stream ends, ctx ends (its
// error) or emit fails.
func (s *frameStream) run(ctx context.Context, emit func(api.Frame) error) error {
	files := make([]*os.File, len(s.Sources))
	defer func() {
		for _, f := range files {
			if f != nil {
				f.Close()
			}
		}
	}()
	buf := make([]byte, maxFrameData)
	for {
		progressed, allDone := false, true
		var waits [2]<-chan struct{}
		for i, src := range s.Sources {
			st, ch := src.State()
			off := s.Offsets[i]
			switch {
			case off < st.Kept:
				if files[i] == nil {
					f, err := os.Open(src.Path)
					if err != nil {
						return err
					}
					files[i] = f
				}
				n, err := files[i].ReadAt(buf[:min(st.Kept-off, int64(len(buf)))], off)
				if n == 0 {
					if err == nil || errors.Is(err, io.EOF) {
						err = io.ErrUnexpectedEOF // the file is shorter than what was kept
					}
					return err
				}
				if err := emit(api.Frame{Type: src.Name, Offset: off, Data: buf[:n]}); err != nil {
					return err
				}
				s.Offsets[i] += int64(n)
				progressed = true
			case off < st.Kept+st.Dropped:
				end := st.Kept + st.Dropped
				if err := emit(api.Frame{Type: api.FrameDropped, Stream: src.Name, Bytes: end - off, Offset: end}); err != nil {
					return err
				}
				s.Offsets[i] = end
				progressed = true
			}
			if !st.Done {
				allDone = false
				if i < len(waits) {
					waits[i] = ch
				}
			}
		}
		switch {
		case progressed:
			continue
		case !s.Follow:
			return emit(api.Frame{Type: api.FrameEnd})
		case allDone:
			last := api.Frame{Type: api.FrameEnd}
			if s.Last != nil {
				var err error
				if last, err = s.Last(ctx); err != nil {
					return err
				}
			}
			return emit(last)
		}
		select {
		case <-waits[0]:
		case <-waits[1]:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
