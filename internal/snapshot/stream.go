package snapshot

// The layer's changes as a git fast-import stream: the import of what
// shim's own (Import) leaves to git. The stream is git's to read; shim
// never parses it back.

import (
	"bufio"
	"fmt"
	"io"

	"github.com/shimdev/shim/internal/gitformat"
)

// A Commit is what a layer snapshot's commit is made of besides
// the layer: its ref, its message, its parents (the first the baseline),
// the baseline's tree and its time.
type Commit struct {
	Ref, Msg, BaseTree string
	Parents            []string
	Now                int64 // seconds since the epoch, UTC
}

// ident is the commit's author and committer, as fast-import writes one
// given only a committer.
func (c Commit) ident() string {
	return fmt.Sprintf("shim <shim@localhost> %d +0000", c.Now)
}

// A Stream writes the layer's changes as a git fast-import stream of
// commit c: Head, the walk's file commands (a Sink), then End; fast-import
// answers the commit's name.
type Stream struct {
	w *bufio.Writer
	c Commit
}

// NewStream is the stream of commit c on w.
func NewStream(w io.Writer, c Commit) *Stream { return &Stream{w: bufio.NewWriterSize(w, 1<<16), c: c} }

// Head writes the commit's header: its ref, committer, message, parents,
// and the baseline's tree as its root.
func (s *Stream) Head() error {
	c := s.c
	fmt.Fprintf(s.w, "commit %s\nmark :1\ncommitter %s\ndata %d\n%s\nfrom %s\n", c.Ref, c.ident(), len(c.Msg), c.Msg, c.Parents[0])
	for _, p := range c.Parents[1:] {
		fmt.Fprintf(s.w, "merge %s\n", p)
	}
	_, err := fmt.Fprintf(s.w, "M 040000 %s \"\"\n", c.BaseTree)
	return err
}

// End ends the commit, asks for its name, and flushes the stream.
func (s *Stream) End() error {
	if _, err := s.w.WriteString("\nget-mark :1\ndone\n"); err != nil {
		return err
	}
	return s.w.Flush()
}

// Enter (the Sink's) deletes the baseline's entry at an opaque p: what
// the layer has there is put after.
func (s *Stream) Enter(p string, opaque bool) error {
	if opaque {
		_, err := fmt.Fprintf(s.w, "D %s\n", gitformat.QuotePath(p))
		return err
	}
	return nil
}

// Leave (the Sink's) writes nothing: a directory is its entries.
func (s *Stream) Leave() error { return nil }

// Put (the Sink's) writes the file inline.
func (s *Stream) Put(p string, mode uint32, size int64, body io.ReaderAt) error {
	fmt.Fprintf(s.w, "M %o inline %s\ndata %d\n", mode, gitformat.QuotePath(p), size)
	if n, err := io.Copy(s.w, io.NewSectionReader(body, 0, size)); err != nil || n != size {
		return fmt.Errorf("read %s: %d of %d bytes: %v", p, n, size, err)
	}
	return s.w.WriteByte('\n')
}

// Remove (the Sink's) deletes p.
func (s *Stream) Remove(p string) error {
	_, err := fmt.Fprintf(s.w, "D %s\n", gitformat.QuotePath(p))
	return err
}
