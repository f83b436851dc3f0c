package gitguard

import "github.com/shimdev/shim/internal/gitformat"

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
	for len(stack) > 0 {
		w := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if t, ok := seen[w.id]; ok {
			if t != w.typ {
				return nil // one name wanted as two types: git refuses the second
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
		case o == nil, o.typ != w.typ, o.data == nil && o.size > 0:
			return nil
		}
		switch o.typ {
		case gitformat.Commit:
			tree, parents, ok := gitformat.CommitLinks(o.data, store.hexLen)
			if !ok {
				return nil
			}
			h.commits++
			stack = append(stack, want{tree, gitformat.Tree})
			for _, p := range parents {
				stack = append(stack, want{p, gitformat.Commit})
			}
		case gitformat.Tree:
			ok := gitformat.TreeEntries(o.data, store.hexLen/2, func(mode, id string) bool {
				// git's reading of a mode (octal digits only, then
				// canon_mode): a directory, a file or symlink, else a gitlink
				m := 0
				for _, c := range mode {
					if c < '0' || c > '7' || m > 1<<24 {
						return false
					}
					m = m<<3 | int(c-'0')
				}
				switch m & 0o170000 {
				case 0o040000:
					stack = append(stack, want{id, gitformat.Tree})
				case 0o100000, 0o120000:
					stack = append(stack, want{id, gitformat.Blob})
				default: // a gitlink: a commit of another repository
				}
				return true
			})
			if !ok {
				return nil
			}
		}
	}
	return h
}
