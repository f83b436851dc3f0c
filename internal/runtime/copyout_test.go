package runtime

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// syncBuffer is a writer the test reads once the copier has written.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Write(p)
	select {
	case s.wrote <- struct{}{}:
	default:
	}
	return len(p), nil
}

func (s *syncBuffer) waitFor(t *testing.T, want string) string {
	t.Helper()
	for {
		s.mu.Lock()
		got := s.b.String()
		s.mu.Unlock()
		if strings.Contains(got, want) {
			return got
		}
		<-s.wrote
	}
}

func TestCopiedOutputIsPrefixedLineByLine(t *testing.T) {
	sb := &syncBuffer{wrote: make(chan struct{}, 1)}
	co := NewCopyOutput(sb, 0)
	defer co.Close()
	out, errs := co.copierFor(3, "stdout"), co.copierFor(3, "stderr")
	out.write([]byte("hello\nwor"))
	out.write([]byte("ld\npartial"))
	errs.write([]byte("oops\n"))
	out.flush()
	got := sb.waitFor(t, "[gen 3] partial\n")
	for _, want := range []string{"[gen 3] hello\n", "[gen 3] world\n", "[gen 3 stderr] oops\n", "[gen 3] partial\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q not in %q", want, got)
		}
	}
	if strings.Contains(got, "] wor\n") {
		t.Errorf("a line cut at a chunk's end: %q", got)
	}
}

// A stdout that nobody reads never blocks the harness's copy: what does
// not fit the bound is dropped and counted, and once the writer moves
// again a notice says how much was lost.
func TestASlowStdoutDropsLinesAndNeverBlocks(t *testing.T) {
	release := make(chan struct{})
	sb := &syncBuffer{wrote: make(chan struct{}, 1)}
	blocked := &blockingWriter{release: release, next: sb, started: make(chan struct{})}
	const max = 4096
	co := NewCopyOutput(blocked, max)
	defer co.Close()
	l := co.copierFor(1, "stdout")
	line := []byte(strings.Repeat("y", 99) + "\n")
	l.write(line) // the writer takes this one and blocks on it
	<-blocked.started
	for range 1000 { // 100 KB: 25 times the bound, and this loop never waits
		l.write(line)
	}
	if co.Dropped() == 0 {
		t.Fatal("nothing dropped while stdout was blocked")
	}
	dropped := co.Dropped()
	close(release)
	got := sb.waitFor(t, "bytes of harness output not copied")
	if n := strings.Count(got, "[gen 1] "); n > max/len("[gen 1] ")+1 || n == 0 {
		t.Errorf("%d lines written", n)
	}
	t.Logf("dropped %d bytes of %d while stdout was blocked", dropped, 1001*(len(line)+len("[gen 1] ")))
}

type blockingWriter struct {
	release <-chan struct{}
	next    *syncBuffer
	once    sync.Once
	started chan struct{}
}

func (b *blockingWriter) Write(p []byte) (int, error) {
	b.once.Do(func() { close(b.started) })
	<-b.release
	return b.next.Write(p)
}
