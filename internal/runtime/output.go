package runtime

import (
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// outputs are a harness's stdout and stderr: pipes whose other ends shim
// copies into gen/<N>/stdout and stderr, each capped at max bytes. What is
// past the cap, or cannot be written because the filesystem is full, is
// dropped and counted, so a harness can never fill the runtime dir through
// its output (the files were the harness's own fds before: `cat /dev/zero`
// filled the disk under state.json).
type outputs struct {
	stdout, stderr *cappedCopy
	done           sync.WaitGroup
}

// newOutputs opens the two files and pipes; the write ends go to the
// harness (and are closed by the caller once it started).
func newOutputs(stdoutPath, stderrPath string, max int64) (o *outputs, wOut, wErr *os.File, err error) {
	o = &outputs{}
	if o.stdout, wOut, err = newCappedCopy(stdoutPath, max); err != nil {
		return nil, nil, nil, err
	}
	if o.stderr, wErr, err = newCappedCopy(stderrPath, max); err != nil {
		o.stdout.abort()
		wOut.Close()
		return nil, nil, nil, err
	}
	return o, wOut, wErr, nil
}

// start begins copying.
func (o *outputs) start() {
	for _, c := range []*cappedCopy{o.stdout, o.stderr} {
		o.done.Add(1)
		go func(c *cappedCopy) {
			defer o.done.Done()
			c.run()
		}(c)
	}
}

// copyTo copies both streams, line by line, to co as well (nil: not at
// all), before start.
func (o *outputs) copyTo(co *CopyOutput, n uint64) {
	o.stdout.tee, o.stderr.tee = co.copierFor(n, "stdout"), co.copierFor(n, "stderr")
}

// wait waits up to d for both copies to reach the end of their pipes
// (every writer gone).
func (o *outputs) wait(d time.Duration) {
	ch := make(chan struct{})
	go func() { o.done.Wait(); close(ch) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// dropped returns how many bytes of stdout and stderr were not kept.
func (o *outputs) dropped() (int64, int64) {
	return o.stdout.dropped.Load(), o.stderr.dropped.Load()
}

// cappedCopy copies a pipe into a file, keeping at most max bytes (max < 0:
// no cap). The file is always a prefix of what was written: past the cap,
// or after a write failed (a full disk), everything is dropped and counted,
// never kept further on, so a byte's offset in the file is its offset in
// the stream (what GET .../logs reports).
type cappedCopy struct {
	r       *os.File
	f       *os.File
	max     int64
	kept    atomic.Int64
	dropped atomic.Int64
	full    bool        // a write failed: nothing more is kept (run's only)
	tee     *lineCopier // gets every chunk read, kept or not (--copy-output); nil: none

	mu      sync.Mutex
	changed chan struct{} // closed (and replaced) when kept, dropped or done change
	done    bool          // every writer is gone: nothing more comes
}

func newCappedCopy(path string, max int64) (*cappedCopy, *os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return &cappedCopy{r: r, f: f, max: max, changed: make(chan struct{})}, w, nil
}

func (c *cappedCopy) abort() { c.r.Close(); c.f.Close() }

// run copies until every writer is gone. A write error (a full disk) drops
// the rest of the output, not the copy: the pipe is always drained, so the
// harness never blocks on its output because shim cannot store it.
func (c *cappedCopy) run() {
	defer c.finish()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.r.Read(buf)
		if n > 0 {
			if c.tee != nil {
				c.tee.write(buf[:n])
			}
			c.write(buf[:n])
		}
		if err != nil {
			return // io.EOF: every writer is gone
		}
	}
}

func (c *cappedCopy) finish() {
	c.abort()
	if c.tee != nil {
		c.tee.flush()
	}
	c.mu.Lock()
	c.done = true
	c.notifyLocked()
	c.mu.Unlock()
}

// write keeps what of p fits and counts the rest. The counters move
// together, under mu, so that a reader (state) never sees bytes counted
// as dropped before the kept bytes in front of them.
func (c *cappedCopy) write(p []byte) {
	keep := int64(len(p))
	if kept := c.kept.Load(); c.full {
		keep = 0
	} else if c.max >= 0 && kept+keep > c.max {
		keep = max(c.max-kept, 0)
	}
	if keep > 0 {
		w, err := c.f.Write(p[:keep])
		if err != nil || int64(w) < keep {
			c.full = true
		}
		keep = int64(w)
	}
	c.mu.Lock()
	c.kept.Add(keep)
	c.dropped.Add(int64(len(p)) - keep)
	c.notifyLocked()
	c.mu.Unlock()
}

// notifyLocked wakes whoever waits for more of this output (a
// frameStream). c.mu held.
func (c *cappedCopy) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// state is where the copy is, and a channel closed at its next change.
func (c *cappedCopy) state() (streamState, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return streamState{Kept: c.kept.Load(), Dropped: c.dropped.Load(), Done: c.done}, c.changed
}
