package snapshot

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

// A small layer's fast-import stream, byte for byte.
func TestStreamGolden(t *testing.T) {
	dir := layer(t, map[string]string{
		"a.txt":       "hello\n",
		"bin/run":     "+x #!/bin/sh\n",
		"bin/link":    "->run",
		"gone.wh":     "",
		"opq.opq/new": "n",
		"q\"uote":     "",
	})
	var out bytes.Buffer
	c := testCommit
	c.Parents = append(c.Parents, "2222222222222222222222222222222222222222")
	c.BaseTree = "3333333333333333333333333333333333333333"
	s := NewStream(&out, c)
	if err := s.Head(); err != nil {
		t.Fatal(err)
	}
	skipped, _, err := walkLayer(t, dir, markSink{s}, 1<<20, Defaults(), true)
	if err != nil || len(skipped) != 0 {
		t.Fatal(err, skipped)
	}
	if err := s.End(); err != nil {
		t.Fatal(err)
	}
	want := `commit refs/shim/snap
mark :1
committer shim <shim@localhost> 1700000000 +0000
data 9
snapshot

from 1111111111111111111111111111111111111111
merge 2222222222222222222222222222222222222222
M 040000 3333333333333333333333333333333333333333 ""
M 100644 inline "a.txt"
data 6
hello

M 120000 inline "bin/link"
data 3
run
M 100755 inline "bin/run"
data 10
#!/bin/sh

D "gone"
D "opq"
M 100644 inline "opq/new"
data 1
n
M 100644 inline "q\"uote"
data 0


get-mark :1
done
`
	if out.String() != want {
		t.Errorf("stream:\n%s\nwant:\n%s", out.String(), want)
	}
}

// A file shorter than the walk said fails the stream's put.
func TestStreamShortFile(t *testing.T) {
	var out bytes.Buffer
	s := NewStream(&out, testCommit)
	if err := s.Put("f", 0o100644, 5, strings.NewReader("ab")); err == nil {
		t.Error("a short file streamed")
	}
}

// errWriter fails every write.
type errWriter struct{}

func (errWriter) Write([]byte) (int, error) { return 0, errors.New("closed") }

// A stream whose reader is gone fails at its flush.
func TestStreamWriteError(t *testing.T) {
	c := testCommit
	c.BaseTree = "3333333333333333333333333333333333333333"
	s := NewStream(errWriter{}, c)
	if err := s.Head(); err != nil {
		t.Fatal(err) // buffered
	}
	w := NewWalk(s, 1<<20, Defaults(), true, func(api.NotStoredFile) {})
	if err := w.Run(openDir(t, layer(t, map[string]string{"a": "a"}))); err != nil {
		t.Fatal(err)
	}
	if err := s.End(); err == nil {
		t.Error("a stream to a closed reader ended")
	}
}
