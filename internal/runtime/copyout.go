package runtime

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
)

// DefaultCopyOutputBytes bounds what --copy-output holds for a slow
// stdout: past it, lines are dropped and counted.
const DefaultCopyOutputBytes = 1 << 20

// maxCopiedLine is the longest line copied whole: a longer one is cut
// into pieces of this size, each with its prefix.
const maxCopiedLine = 16 << 10

// CopyOutput copies every harness's output to a writer (shim init
// --copy-output: shim's stdout, so docker logs shows it), each line
// prefixed with its generation. It never makes a harness, or PID 1, wait
// for that writer: lines are queued, at most max bytes of them, and one
// goroutine writes them; when the writer is slower than the harnesses,
// lines are dropped and counted, and a notice says how many bytes were
// lost once the writer catches up. Memory is bounded by 2*max (the queue
// and the chunk being written).
type CopyOutput struct {
	w       io.Writer
	max     int
	mu      sync.Mutex
	queue   []byte // guarded by mu
	lost    int64  // bytes dropped since the last notice; guarded by mu
	dropped atomic.Int64
	wake    chan struct{} // capacity 1: the writer has something to do
	stop    chan struct{}
	stopped sync.Once
}

// NewCopyOutput starts copying to w, holding at most max bytes for it
// (0: DefaultCopyOutputBytes). Close stops the writer.
func NewCopyOutput(w io.Writer, max int) *CopyOutput {
	if max <= 0 {
		max = DefaultCopyOutputBytes
	}
	c := &CopyOutput{w: w, max: max, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	go c.run()
	return c
}

// Dropped is how many bytes were not copied because the writer was slow.
func (c *CopyOutput) Dropped() int64 { return c.dropped.Load() }

// Close stops the writer goroutine (a write in progress finishes first).
func (c *CopyOutput) Close() { c.stopped.Do(func() { close(c.stop) }) }

// add queues one prefixed line, or drops it when the queue is full. It
// never blocks on the writer.
func (c *CopyOutput) add(prefix string, line []byte, newline bool) {
	n := len(prefix) + len(line)
	if newline {
		n++
	}
	c.mu.Lock()
	if len(c.queue)+n > c.max {
		c.lost += int64(n)
		c.mu.Unlock()
		c.dropped.Add(int64(n))
		return
	}
	c.queue = append(c.queue, prefix...)
	c.queue = append(c.queue, line...)
	if newline {
		c.queue = append(c.queue, '\n')
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *CopyOutput) run() {
	var spare []byte
	for {
		select {
		case <-c.wake:
		case <-c.stop:
			return
		}
		for {
			c.mu.Lock()
			chunk, lost := c.queue, c.lost
			c.queue, c.lost = spare[:0], 0
			c.mu.Unlock()
			if len(chunk) == 0 && lost == 0 {
				spare = chunk
				break
			}
			if lost > 0 {
				chunk = append(chunk, fmt.Sprintf("[shim] %d bytes of harness output not copied here: this output was slower than the harness (all of it is in the runtime dir, within --log-max)\n", lost)...)
			}
			c.w.Write(chunk) // an error (a closed stdout) is a drop like any other
			spare = chunk
			if cap(spare) > 2*c.max {
				spare = nil // the notice grew it: do not keep more than the bound
			}
		}
	}
}

// lineCopier cuts one stream of one generation into lines for a
// CopyOutput. Used by that stream's copy goroutine only.
type lineCopier struct {
	co      *CopyOutput
	prefix  string
	partial []byte // the line begun and not ended yet, at most maxCopiedLine
}

// copierFor is stream's line copier of generation n ("stdout": "[gen N] ",
// "stderr": "[gen N stderr] "); nil when co is nil.
func (co *CopyOutput) copierFor(n uint64, stream string) *lineCopier {
	if co == nil {
		return nil
	}
	p := "[gen " + strconv.FormatUint(n, 10)
	if stream != "stdout" {
		p += " " + stream
	}
	return &lineCopier{co: co, prefix: p + "] "}
}

func (l *lineCopier) write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			room := maxCopiedLine - len(l.partial)
			if len(p) < room {
				l.partial = append(l.partial, p...)
				return
			}
			l.partial = append(l.partial, p[:room]...)
			l.co.add(l.prefix, l.partial, true)
			l.partial = l.partial[:0]
			p = p[room:]
			continue
		}
		line := p[:i]
		if len(l.partial) > 0 {
			l.partial = append(l.partial, line...)
			line = l.partial
		}
		for len(line) > maxCopiedLine {
			l.co.add(l.prefix, line[:maxCopiedLine], true)
			line = line[maxCopiedLine:]
		}
		l.co.add(l.prefix, line, true)
		l.partial = l.partial[:0]
		p = p[i+1:]
	}
}

// flush copies a last line that had no newline.
func (l *lineCopier) flush() {
	if len(l.partial) > 0 {
		l.co.add(l.prefix, l.partial, true)
		l.partial = l.partial[:0]
	}
}
