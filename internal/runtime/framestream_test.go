package runtime

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/shimdev/shim/api"
)

// capped starts a cappedCopy of max bytes into dir/name and returns it
// with the pipe's write end.
func capped(t *testing.T, dir, name string, max int64) (*cappedCopy, *os.File) {
	t.Helper()
	c, w, err := newCappedCopy(filepath.Join(dir, name), max)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { c.run(); close(done) }()
	t.Cleanup(func() { w.Close(); <-done })
	return c, w
}

func waitDone(c *cappedCopy) {
	for {
		st, ch := c.state()
		if st.Done {
			return
		}
		<-ch
	}
}

func collect(t *testing.T, s *frameStream) []api.Frame {
	t.Helper()
	var out []api.Frame
	err := s.run(context.Background(), func(f api.Frame) error {
		f.Data = bytes.Clone(f.Data)
		out = append(out, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dataOf joins the data frames of stream name and checks their offsets
// are contiguous from off.
func dataOf(t *testing.T, frames []api.Frame, name string, off int64) []byte {
	t.Helper()
	var b []byte
	for _, f := range frames {
		if f.Type != name {
			continue
		}
		if f.Offset != off+int64(len(b)) {
			t.Fatalf("%s frame at %d, expected %d", name, f.Offset, off+int64(len(b)))
		}
		b = append(b, f.Data...)
	}
	return b
}

func TestOutputPastTheCapIsDroppedAndTheFileStaysAPrefix(t *testing.T) {
	dir := t.TempDir()
	c, w := capped(t, dir, "stdout", 10)
	w.Write([]byte("0123456789ABCDEF"))
	w.Close()
	waitDone(c)
	if b, _ := os.ReadFile(filepath.Join(dir, "stdout")); string(b) != "0123456789" {
		t.Fatalf("file %q", b)
	}
	src := copySource(api.FrameStdout, filepath.Join(dir, "stdout"), c)
	frames := collect(t, &frameStream{Sources: []streamSource{src}, Offsets: []int64{0}})
	if got := dataOf(t, frames, api.FrameStdout, 0); string(got) != "0123456789" {
		t.Errorf("data %q", got)
	}
	last2 := frames[len(frames)-2:]
	if d := last2[0]; d.Type != api.FrameDropped || d.Stream != "stdout" || d.Bytes != 6 || d.Offset != 16 {
		t.Errorf("dropped frame %+v", d)
	}
	if last2[1].Type != api.FrameEnd {
		t.Errorf("last frame %+v", last2[1])
	}
	// From an offset inside what is kept, and from one past it.
	frames = collect(t, &frameStream{Sources: []streamSource{src}, Offsets: []int64{4}})
	if got := dataOf(t, frames, api.FrameStdout, 4); string(got) != "456789" {
		t.Errorf("from 4: %q", got)
	}
	frames = collect(t, &frameStream{Sources: []streamSource{src}, Offsets: []int64{12}})
	if len(frames) != 2 || frames[0].Type != api.FrameDropped || frames[0].Bytes != 4 || frames[0].Offset != 16 {
		t.Errorf("from 12: %+v", frames)
	}
	frames = collect(t, &frameStream{Sources: []streamSource{src}, Offsets: []int64{16}})
	if len(frames) != 1 || frames[0].Type != api.FrameEnd {
		t.Errorf("from the end: %+v", frames)
	}
}

func TestAFailedWriteKeepsNothingAfterIt(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "stdout")
	c, w, err := newCappedCopy(path, -1)
	if err != nil {
		t.Fatal(err)
	}
	c.write([]byte("kept "))
	ro, err := os.Open(path) // a write to it fails, as on a full disk
	if err != nil {
		t.Fatal(err)
	}
	good := c.f
	c.f = ro
	c.write([]byte("lost "))
	c.f = good // the disk has room again: still nothing is kept, or the file would have a hole
	c.write([]byte("after"))
	w.Close()
	ro.Close()
	c.abort()
	if b, _ := os.ReadFile(path); string(b) != "kept " {
		t.Errorf("file %q, want only what came before the failure", b)
	}
	if c.kept.Load() != 5 || c.dropped.Load() != 10 {
		t.Errorf("kept %d dropped %d", c.kept.Load(), c.dropped.Load())
	}
}

func TestAFollowedStreamWaitsForMoreAndEndsWithTheLastFrame(t *testing.T) {
	dir := t.TempDir()
	out, wOut := capped(t, dir, "stdout", 1<<20)
	errc, wErr := capped(t, dir, "stderr", 1<<20)
	exited := make(chan struct{})
	s := &frameStream{
		Sources: []streamSource{
			copySource(api.FrameStdout, filepath.Join(dir, "stdout"), out),
			copySource(api.FrameStderr, filepath.Join(dir, "stderr"), errc),
		},
		Offsets: []int64{0, 0}, Follow: true,
		Last: func(ctx context.Context) (api.Frame, error) {
			<-exited
			return api.Frame{Type: api.FrameExit, Exit: &api.Exit{ExitCode: 3}}, nil
		},
	}
	frames := make(chan api.Frame)
	go s.run(context.Background(), func(f api.Frame) error {
		f.Data = bytes.Clone(f.Data)
		frames <- f
		return nil
	})
	wOut.Write([]byte("one\n"))
	if f := <-frames; f.Type != api.FrameStdout || string(f.Data) != "one\n" {
		t.Fatalf("first frame %+v", f)
	}
	wErr.Write([]byte("two\n"))
	if f := <-frames; f.Type != api.FrameStderr || string(f.Data) != "two\n" || f.Offset != 0 {
		t.Fatalf("second frame %+v", f)
	}
	big := bytes.Repeat([]byte("x"), 3*maxFrameData+5)
	wOut.Write(big)
	var got []byte
	for len(got) < len(big) {
		f := <-frames
		if f.Type != api.FrameStdout || f.Offset != int64(4+len(got)) || len(f.Data) > maxFrameData {
			t.Fatalf("frame %s at %d (%d bytes)", f.Type, f.Offset, len(f.Data))
		}
		got = append(got, f.Data...)
	}
	wOut.Close()
	wErr.Close()
	close(exited)
	if f := <-frames; f.Type != api.FrameExit || f.Exit.ExitCode != 3 {
		t.Fatalf("last frame %+v", f)
	}
}

func TestAFollowedStreamEndsWithItsContext(t *testing.T) {
	dir := t.TempDir()
	out, _ := capped(t, dir, "stdout", 100)
	ctx, cancel := context.WithCancel(context.Background())
	s := &frameStream{Sources: []streamSource{copySource(api.FrameStdout, filepath.Join(dir, "stdout"), out)},
		Offsets: []int64{0}, Follow: true}
	done := make(chan error)
	go func() { done <- s.run(ctx, func(api.Frame) error { return nil }) }()
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("run: %v", err)
	}
}
