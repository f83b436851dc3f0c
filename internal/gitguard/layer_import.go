package gitguard

// A layer snapshot's import: shim's own (snapshot.Import) of the walk's
// typed changes into a pack of the repository's, then the ref; git
// fast-import's (snapshot.Stream) for what shim's does not take
// (snapshot.ErrNotHere): a ref that exists, a store shim does not read
// alone, a parent that is not a commit of the store, a baseline tree of a
// shape git would not write or past the import's bounds.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
	"github.com/shimdev/shim/internal/snapshot"
)

// errNotHere: the import needs git fast-import.
var errNotHere = snapshot.ErrNotHere

// layerBounds are the layer walk's bounds; the tests raise or lower them.
var layerBounds = snapshot.Defaults()

// newLayerWalk is a walk that hands the layer's changes to sink (scanned:
// git fast-import's) and lists in rep what it does not store (files over
// max among them).
func newLayerWalk(rep *Report, max int64, sink snapshot.Sink, scanned bool) *snapshot.Walk {
	return snapshot.NewWalk(sink, max, layerBounds, scanned, func(f NotStoredFile) {
		if len(rep.NotStored) < maxListed {
			rep.NotStored = append(rep.NotStored, f)
		}
	})
}

// importInShim imports the layer open at ufd as commit c, writes its
// pack and ref, and reports whether the changes it put in rep describe
// the layer. errNotHere: nothing git would see was written.
func (g *Guard) importInShim(ctx context.Context, ufd int, c snapshot.Commit, rep *Report) (string, bool, error) {
	if !g.noRef(c.Ref) || !strings.HasPrefix(c.Ref, RefPrefix) {
		return "", false, fmt.Errorf("%w: ref %s exists or is not a snapshot's", errNotHere, c.Ref)
	}
	s, ok := openObjectStore(g.gitDir, len(c.BaseTree))
	if !ok {
		return "", false, fmt.Errorf("%w: an object store shim does not read alone", errNotHere)
	}
	defer s.close()
	s.budget = snapshot.TreeInflateMax
	for _, p := range c.Parents {
		if len(p) != s.hexLen || s.typeOf(p) != gitformat.Commit {
			return "", false, fmt.Errorf("%w: a parent that is not a commit of the store: %s", errNotHere, p)
		}
	}
	np, err := s.newPack("_snapshot")
	if err != nil {
		return "", false, fmt.Errorf("%w: the pack: %v", errNotHere, err)
	}
	pack := gitformat.NewPackStream(np.f, s.hexLen)
	m := snapshot.NewImport(ctx, storeView{s}, pack)
	commit, err := m.Run(ufd, c, newLayerWalk(rep, g.maxFile, m, false))
	if err != nil {
		np.abandon()
		return "", false, err
	}
	// What shim cannot write (a full disk, a name taken) git tries too:
	// a pack written before the ref is only objects no ref names yet.
	if err := installPack(np, pack); err != nil {
		return "", false, fmt.Errorf("%w: the pack: %v", errNotHere, err)
	}
	if err := g.writeRef(c.Ref, commit); err != nil {
		return "", false, fmt.Errorf("%w: the ref: %v", errNotHere, err)
	}
	g.learnWhole(m.Trees())
	changes, described := m.Changes()
	if described {
		reportChanges(rep, changes)
	}
	return commit, described, nil
}

// installPack ends the pack and puts it in the store (abandoned when it
// holds nothing new, or fails).
func installPack(np *newPack, pack *gitformat.PackStream) error {
	if pack.Count() == 0 {
		np.abandon()
		return nil
	}
	entries, sum, err := pack.Finish()
	if err != nil {
		np.abandon()
		return err
	}
	return np.install(entries, sum)
}

// reportChanges fills rep's changes from the import's (in diff-tree's
// order): counted, the first maxListed listed.
func reportChanges(rep *Report, changes []PathChange) {
	for _, c := range changes {
		switch c.Change {
		case "added":
			rep.Added++
		case "deleted":
			rep.Deleted++
		default:
			rep.Modified++
		}
		if len(rep.Paths) >= maxListed {
			rep.PathsTruncated = true
			continue
		}
		rep.Paths = append(rep.Paths, c)
	}
}

// storeView is the store as the import reads it.
type storeView struct{ s *objectStore }

func (v storeView) HexLen() int                                    { return v.s.hexLen }
func (v storeView) Read(id string, max int64) (int, []byte, error) { return v.s.read(id, max) }
func (v storeView) HasPacked(id string) bool                       { return v.s.hasPacked(id) }

// importByGit streams the layer open at ufd into one git fast-import as
// commit c (force: over a ref that exists) and returns the commit.
func (g *Guard) importByGit(ctx context.Context, ufd int, c snapshot.Commit, force bool, rep *Report) (string, error) {
	pr, pw := io.Pipe()
	// The walk ends before this returns: it reads below ufd, which the
	// caller closes (and PID 1 may reuse its number) and imports again.
	// Once fast-import ended, the walk stops at its next directory or file
	// (an empty directory writes nothing to the pipe that would fail).
	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		st := snapshot.NewStream(pw, c)
		err := st.Head()
		if err == nil {
			err = newLayerWalk(rep, g.maxFile, stoppable{st, wctx}, true).Run(ufd)
		}
		if err == nil {
			err = st.End()
		}
		pw.CloseWithError(err)
	}()
	args := []string{"fast-import", "--quiet", "--done", "--date-format=raw"}
	if force {
		args = append(args, "--force") // over a first import whose parents were not all whole
	}
	out, err := g.git(ctx, gitOpts{stdin: pr, config: []string{"fastimport.unpackLimit=0"}}, args...)
	stop()
	pr.CloseWithError(errors.New("fast-import ended"))
	<-done
	if err != nil {
		return "", err
	}
	commit := strings.TrimSuffix(string(out), "\n")
	if !isHex(commit) || len(commit) != len(c.BaseTree) {
		return "", fmt.Errorf("fast-import answered %q", commit)
	}
	return commit, nil
}

// stoppable is a sink that stops the walk once ctx is done (the stream's:
// the walk does not end with fast-import otherwise).
type stoppable struct {
	snapshot.Sink
	ctx context.Context
}

func (s stoppable) Enter(p string, opaque bool) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	return s.Sink.Enter(p, opaque)
}

func (s stoppable) Put(p string, mode uint32, size int64, body io.ReaderAt) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	return s.Sink.Put(p, mode, size, body)
}
