package runtime

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
)

// A harness's output can never fill the runtime dir, and never blocks the
// harness: what is past the cap (or cannot be written) is drained, dropped
// and counted.

// copyAll writes data into a capped copy's pipe from another goroutine,
// closes it, and runs the copy to the end of the pipe. It fails the test if
// the writer blocks (the pipe not drained).
func copyAll(t *testing.T, c *cappedCopy, w *os.File, data []byte) {
	t.Helper()
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(data)
		w.Close()
		wrote <- err
	}()
	ran := make(chan struct{})
	go func() { c.run(); close(ran) }()
	select {
	case err := <-wrote:
		if err != nil {
			t.Fatalf("the harness's write failed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the harness blocked on its output: the pipe is not drained")
	}
	<-ran
}

func TestCappedCopyKeepsMaxBytesAndCountsTheRest(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stdout")
	c, w, err := newCappedCopy(p, 10)
	if err != nil {
		t.Fatal(err)
	}
	copyAll(t, c, w, []byte("0123456789abcdefghijklmno"))
	if b, _ := os.ReadFile(p); string(b) != "0123456789" {
		t.Errorf("kept %q", b)
	}
	if d := c.dropped.Load(); d != 15 {
		t.Errorf("dropped %d, want 15", d)
	}
}

func TestCappedCopyDrainsFarMoreThanThePipeHolds(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stdout")
	c, w, err := newCappedCopy(p, 100)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("x"), 4<<20) // far past a pipe's 64 KiB
	copyAll(t, c, w, data)
	if fi, _ := os.Stat(p); fi.Size() != 100 {
		t.Errorf("kept %d bytes", fi.Size())
	}
	if d := c.dropped.Load(); d != int64(len(data))-100 {
		t.Errorf("dropped %d", d)
	}
}

func TestCappedCopyWithoutCapKeepsEverything(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stdout")
	c, w, err := newCappedCopy(p, -1)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789"), 30000)
	copyAll(t, c, w, data)
	if b, _ := os.ReadFile(p); !bytes.Equal(b, data) || c.dropped.Load() != 0 {
		t.Errorf("kept %d of %d bytes, dropped %d", len(b), len(data), c.dropped.Load())
	}
}

func TestCappedCopyThatCannotWriteStillDrains(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stdout")
	c, w, err := newCappedCopy(p, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// The file refuses every write, as a full filesystem does.
	c.f.Close()
	if c.f, err = os.Open(p); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("y"), 1<<18)
	copyAll(t, c, w, data)
	if d := c.dropped.Load(); d != int64(len(data)) {
		t.Errorf("dropped %d of %d unwritable bytes", d, len(data))
	}
}

func TestOutputsCopyBothStreamsAndReportWhatWasDropped(t *testing.T) {
	dir := t.TempDir()
	o, wOut, wErr, err := newOutputs(filepath.Join(dir, "stdout"), filepath.Join(dir, "stderr"), 4)
	if err != nil {
		t.Fatal(err)
	}
	o.start()
	wOut.Write([]byte("out-1234"))
	wErr.Write([]byte("err"))
	// A writer still open: wait gives up after its deadline.
	o.wait(time.Millisecond)
	wOut.Close()
	wErr.Close()
	o.wait(time.Hour) // returns as soon as both pipes are at their end
	if b, _ := os.ReadFile(filepath.Join(dir, "stdout")); string(b) != "out-" {
		t.Errorf("stdout %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "stderr")); string(b) != "err" {
		t.Errorf("stderr %q", b)
	}
	if so, se := o.dropped(); so != 4 || se != 0 {
		t.Errorf("dropped %d %d", so, se)
	}
}

func TestOutputsThatCannotBeOpenedLeaveNothingOpen(t *testing.T) {
	dir := t.TempDir()
	if _, _, _, err := newOutputs(filepath.Join(dir, "no", "stdout"), filepath.Join(dir, "stderr"), 4); err == nil {
		t.Error("stdout in a missing dir")
	}
	if _, _, _, err := newOutputs(filepath.Join(dir, "stdout"), filepath.Join(dir, "no", "stderr"), 4); err == nil {
		t.Error("stderr in a missing dir")
	}
}

// outStarter gives each harness capped outputs, as the launcher does.
type outStarter struct {
	*fakeStarter
	max  int64
	outs map[uint64][2]*os.File
}

func (s outStarter) start(ctx context.Context, req api.StartRequest, baseline string, early *earlyStart) (*generation, error) {
	g, err := s.fakeStarter.start(ctx, req, baseline, early)
	if err != nil {
		return nil, err
	}
	o, wOut, wErr, err := newOutputs(filepath.Join(g.dir, "stdout"), filepath.Join(g.dir, "stderr"), s.max)
	if err != nil {
		return nil, err
	}
	o.start()
	g.out = o
	s.outs[req.Generation] = [2]*os.File{wOut, wErr}
	return g, nil
}

func TestTheRecordCountsTheOutputDropped(t *testing.T) {
	f := newFixture(t)
	s := outStarter{fakeStarter: f.s, max: 5, outs: map[uint64][2]*os.File{}}
	f.rt.launch = s
	f.mustStart(1, func(r *api.StartRequest) { r.Linger = true })
	w := s.outs[1]
	w[0].Write([]byte("hello, world"))
	w[1].Write([]byte("oops"))
	w[0].Close()
	w[1].Close()
	f.s.group(1).proc.exit(0)
	if _, err := f.rt.Wait(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	f.rt.mu.Lock()
	out := f.rt.gens[1].out
	f.rt.mu.Unlock()
	out.done.Wait()
	rec, err := f.rt.Generation(1)
	if err != nil {
		t.Fatal(err)
	}
	if rec.StdoutDropped != 7 || rec.StderrDropped != 0 || rec.Stdout != filepath.Join(f.dir, "gen", "1", "stdout") {
		t.Errorf("record: dropped %d %d, stdout %s", rec.StdoutDropped, rec.StderrDropped, rec.Stdout)
	}
	if b, _ := os.ReadFile(rec.Stdout); string(b) != "hello" {
		t.Errorf("stdout %q", b)
	}
}
