package gitguard

// The layer's changes as a git fast-import stream: the import of what
// shim's own (treeImport) leaves to git. The stream is git's to read;
// shim never parses it back.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// A snapshotCommit is what a layer snapshot's commit is made of besides
// the layer: its ref, its message, its parents (the first the baseline),
// the baseline's tree and its time.
type snapshotCommit struct {
	ref, msg, baseTree string
	parents            []string
	now                int64 // seconds since the epoch, UTC
}

// ident is the commit's author and committer, as fast-import writes one
// given only a committer.
func (c snapshotCommit) ident() string {
	return fmt.Sprintf("shim <shim@localhost> %d +0000", c.now)
}

// streamSink writes the layer's changes as fast-import file commands.
type streamSink struct{ w *bufio.Writer }

func (s *streamSink) enter(p string, opaque bool) error {
	if opaque { // the baseline's entry goes; what the layer has there is put after
		_, err := fmt.Fprintf(s.w, "D %s\n", quotePath(p))
		return err
	}
	return nil
}

func (s *streamSink) leave() error { return nil }

func (s *streamSink) put(p string, mode uint32, size int64, body io.ReaderAt) error {
	fmt.Fprintf(s.w, "M %o inline %s\ndata %d\n", mode, quotePath(p), size)
	if n, err := io.Copy(s.w, io.NewSectionReader(body, 0, size)); err != nil || n != size {
		return fmt.Errorf("read %s: %d of %d bytes: %v", p, n, size, err)
	}
	return s.w.WriteByte('\n')
}

func (s *streamSink) remove(p string) error {
	_, err := fmt.Fprintf(s.w, "D %s\n", quotePath(p))
	return err
}

// importByGit streams the layer open at ufd into one git fast-import as
// commit c (force: over a ref that exists) and returns the commit.
func (g *Guard) importByGit(ctx context.Context, ufd int, c snapshotCommit, force bool, rep *Report) (string, error) {
	pr, pw := io.Pipe()
	go func() {
		bw := bufio.NewWriterSize(pw, 1<<16)
		fmt.Fprintf(bw, "commit %s\nmark :1\ncommitter %s\ndata %d\n%s\nfrom %s\n", c.ref, c.ident(), len(c.msg), c.msg, c.parents[0])
		for _, p := range c.parents[1:] {
			fmt.Fprintf(bw, "merge %s\n", p)
		}
		fmt.Fprintf(bw, "M 040000 %s \"\"\n", c.baseTree)
		err := newLayerWalk(rep, g.maxFile, &streamSink{w: bw}, true).walk(ufd)
		if err == nil {
			_, err = bw.WriteString("\nget-mark :1\ndone\n")
		}
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err)
	}()
	args := []string{"fast-import", "--quiet", "--done", "--date-format=raw"}
	if force {
		args = append(args, "--force") // over a first import whose parents were not all whole
	}
	out, err := g.git(ctx, gitOpts{stdin: pr, config: []string{"fastimport.unpackLimit=0"}}, args...)
	pr.CloseWithError(errors.New("fast-import ended"))
	if err != nil {
		return "", err
	}
	commit := strings.TrimSuffix(string(out), "\n")
	if !isHex(commit) || len(commit) != len(c.baseTree) {
		return "", fmt.Errorf("fast-import answered %q", commit)
	}
	return commit, nil
}
