package gitguard

import (
	"context"
	"path/filepath"
	"strings"

	"github.com/shimdev/shim/internal/gitformat"
)

// A layerHistory is what the layer's own objects say of the harness's
// heads: every one is whole down to the baseline, and they hold this many
// commits of the harness's (what `rev-list --objects` and `rev-list
// --count HEADS --not BASE` would answer, without running them).
type layerHistory struct {
	commits int
}

// readHistory walks the heads' history through the layer's checked loose
// objects that the repository did not have (fresh, by name), down to
// base: each commit's tree and parents, each tree's entries. An object
// that is not fresh must be one of the baseline's: base for a commit, one
// of baseTrees for a tree (its root and subtrees: the baseline's history
// is whole; another tree the repository has may be one an earlier layer
// brought in, as broken as its harness made it), a blob the repository
// has for a blob. It returns nil when the objects alone cannot tell: an
// object missing (a head that is not whole: git then says which), a
// commit or tree the repository had that is not the baseline's, an object
// whose bytes were not kept, or one it does not read (git reads it then,
// and decides).
func readHistory(heads []string, base string, baseTrees map[string]bool, fresh map[string]*looseObject, store *objectStore) *layerHistory {
	h, _ := readHistoryKnown(heads, base, baseTrees, nil, fresh, store)
	return h
}

// readHistoryKnown is readHistory, with the trees shim knows whole beyond
// the baseline's (known: what its own imports wrote, what an earlier walk
// proved; each taken only while the repository has it as a tree), and it
// returns the fresh trees it walked: whole, when the history is.
func readHistoryKnown(heads []string, base string, baseTrees, known map[string]bool, fresh map[string]*looseObject, store *objectStore) (*layerHistory, []string) {
	type want struct {
		id  string
		typ int // gitformat.Commit, gitformat.Tree or gitformat.Blob
	}
	stack := make([]want, 0, len(heads))
	for _, h := range heads {
		stack = append(stack, want{h, gitformat.Commit})
	}
	seen := map[string]int{} // the type each object was wanted as
	h := &layerHistory{}
	var walked []string
	for len(stack) > 0 {
		w := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if t, ok := seen[w.id]; ok {
			if t != w.typ {
				return nil, nil // one name wanted as two types: git refuses the second
			}
			continue
		}
		seen[w.id] = w.typ
		o := fresh[w.id]
		switch {
		case o == nil && w.typ == gitformat.Commit && w.id == base:
			continue
		case o == nil && w.typ == gitformat.Blob && store.typeOf(w.id) == gitformat.Blob:
			// rev-list checks only a blob's existence, unless it has
			// typed the name otherwise (the baseline's trees and
			// commits, marked uninteresting); fsck and a full repack
			// type every object, so a blob entry naming a tree or a
			// commit breaks them: the repository's blob, by its type
			continue
		case o == nil && w.typ == gitformat.Tree && baseTrees[w.id]:
			// one of the baseline's trees: whole, as the baseline's
			// history is (another tree the repository has may be one an
			// earlier layer left there, as broken as its harness made
			// it: git decides)
			continue
		case o == nil && w.typ == gitformat.Tree && known[w.id] && store.typeOf(w.id) == gitformat.Tree:
			// one shim wrote, or an earlier walk proved whole (the same
			// bytes: whole as they were), that the repository still has
			continue
		case o == nil, o.typ != w.typ, o.data == nil && o.size > 0 && o.typ != gitformat.Blob:
			// (a fresh blob's bytes are not needed: checked, it is a blob)
			return nil, nil
		}
		switch o.typ {
		case gitformat.Commit:
			tree, parents, ok := gitformat.CommitLinks(o.data, store.hexLen)
			if !ok {
				return nil, nil
			}
			h.commits++
			stack = append(stack, want{tree, gitformat.Tree})
			for _, p := range parents {
				stack = append(stack, want{p, gitformat.Commit})
			}
		case gitformat.Tree:
			ok := gitformat.TreeEntries(o.data, store.hexLen/2, func(mode, id string) bool {
				typ, ok := entryType(mode)
				if typ != 0 {
					stack = append(stack, want{id, typ})
				}
				return ok
			})
			if !ok {
				return nil, nil
			}
			walked = append(walked, w.id)
		}
	}
	return h, walked
}

// entryType is what a tree entry of mode names, as git reads the mode
// (octal digits only, then canon_mode): gitformat.Tree for a directory,
// gitformat.Blob for a file or symlink, 0 for a gitlink (a commit of
// another repository); false for a mode git refuses.
func entryType(mode string) (int, bool) {
	m := 0
	for _, c := range mode {
		if c < '0' || c > '7' || m > 1<<24 {
			return 0, false
		}
		m = m<<3 | int(c-'0')
	}
	switch m & 0o170000 {
	case 0o040000:
		return gitformat.Tree, true
	case 0o100000, 0o120000:
		return gitformat.Blob, true
	}
	return 0, true
}

// maxWholeTrees bounds the trees kept known whole per git dir (some 6
// MiB); past it the set starts again (the next walk that needs one has
// git check the history).
const maxWholeTrees = 1 << 16

// readKnownHistory is readHistoryKnown with the trees known whole in the
// current git dir, and learns the trees it walked whole.
func (g *Guard) readKnownHistory(heads []string, base string, baseTrees map[string]bool, fresh map[string]*looseObject, store *objectStore) *layerHistory {
	g.wholeMu.Lock()
	h, walked := readHistoryKnown(heads, base, baseTrees, g.wholeTrees[g.gitDir], fresh, store)
	g.wholeMu.Unlock()
	if h != nil {
		g.learnWhole(walked)
	}
	return h
}

// learnWhole adds trees known whole in the current git dir: written by
// shim's own import (their entries are the baseline's, its blobs, or
// trees it wrote), or walked whole by readHistory.
func (g *Guard) learnWhole(ids []string) {
	if len(ids) == 0 {
		return
	}
	g.wholeMu.Lock()
	defer g.wholeMu.Unlock()
	if g.wholeTrees == nil {
		g.wholeTrees = map[string]map[string]bool{}
	}
	m := g.wholeTrees[g.gitDir]
	if m == nil || len(m)+len(ids) > maxWholeTrees {
		m = make(map[string]bool, len(ids))
		g.wholeTrees[g.gitDir] = m
	}
	for _, id := range ids {
		if len(m) < maxWholeTrees {
			m[id] = true
		}
	}
}

// forgetWhole drops what is known whole in the current git dir: a repack
// that may drop objects ran (a tree known whole is taken only while the
// repository has it, but one of its subtrees might have gone).
// ForgetKnown drops what this Guard knows whole of its repository (the
// trees its imports wrote or a walk proved, the baseline's tree list): for
// a layered worktree whose lower was found unlocked, which anyone may have
// written meanwhile. The next history is checked by git.
func (g *Guard) ForgetKnown() {
	g.forgetWhole()
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.baseTrees, g.gitDir)
}

func (g *Guard) forgetWhole() {
	g.wholeMu.Lock()
	defer g.wholeMu.Unlock()
	delete(g.wholeTrees, g.gitDir)
}

// complete keeps the heads whose history, down to base, has every object
// in the repository: a commit whose parent is missing would make the
// snapshot a history git cannot walk (log, gc, clone all fail).
func (g *Guard) complete(ctx context.Context, heads []string, base string) []string {
	// rev-list checks a blob entry's object only for existence (and
	// against a type it has read the name as already, in this walk):
	// a blob entry naming a tree or commit of the repository's that the
	// walk did not type passes, and breaks fsck and the full repack,
	// which type every object. The blobs are left out of the walk and
	// listed (--filter-print-omitted), each then checked to be a blob.
	check := func(hs ...string) bool {
		args := append(append([]string{"rev-list", "--objects", "--no-object-names", "--filter=blob:none", "--filter-print-omitted"}, hs...), "--not", base)
		out, err := g.git(ctx, gitOpts{index: filepath.Join(g.gitDir, "shim-no-index"), quiet: true}, args...)
		if err != nil {
			return false
		}
		var blobs, walked []string
		for _, l := range strings.Split(string(out), "\n") {
			if id, ok := strings.CutPrefix(l, "~"); ok {
				blobs = append(blobs, id)
			} else if l != "" {
				walked = append(walked, l) // the heads' commits and trees
			}
		}
		if !g.allBlobs(ctx, blobs, len(base)) {
			return false
		}
		// every tree git listed is whole (one it did not is the
		// baseline's); a commit among them is never taken for a tree
		g.learnWhole(walked)
		return true
	}
	if len(heads) == 0 || check(heads...) {
		return heads
	}
	var ok []string
	for _, h := range heads {
		if check(h) {
			ok = append(ok, h)
		}
	}
	return ok
}

// allBlobs reports whether every one of ids is a blob the repository
// has: read from its packs' entries and loose headers, else by git.
func (g *Guard) allBlobs(ctx context.Context, ids []string, hexLen int) bool {
	if len(ids) == 0 {
		return true
	}
	if store, ok := openObjectStore(g.gitDir, hexLen); ok {
		defer store.close()
		for _, id := range ids {
			if store.typeOf(id) != gitformat.Blob {
				return false
			}
		}
		return true
	}
	out, err := g.git(ctx, gitOpts{stdin: strings.NewReader(strings.Join(ids, "\n") + "\n"), quiet: true},
		"cat-file", "--batch-check=%(objecttype)")
	if err != nil {
		return false
	}
	types := strings.Fields(string(out))
	if len(types) != len(ids) {
		return false
	}
	for _, t := range types {
		if t != "blob" {
			return false
		}
	}
	return true
}
