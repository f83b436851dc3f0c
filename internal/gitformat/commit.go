package gitformat

import "bytes"

// CommitLinks reads a commit's tree and parents (hex names of hexLen
// digits) from its header, as git writes it: the tree line first, the
// parent lines after it, then the author line. false for anything else
// (git's parse_commit_buffer, commit.c, calls a commit without a tree
// line, or one that ends right after it or a parent line, "bogus"; what
// it reads past that shape is git's to read). It allocates no more names
// than the bytes hold.
func CommitLinks(b []byte, hexLen int) (tree string, parents []string, ok bool) {
	line := func(key string) (string, bool) {
		rest, found := bytes.CutPrefix(b, []byte(key+" "))
		if !found || len(rest) < hexLen+2 || rest[hexLen] != '\n' || !isHex(string(rest[:hexLen])) {
			return "", false
		}
		b = rest[hexLen+1:]
		return string(rest[:hexLen]), true
	}
	if tree, ok = line("tree"); !ok {
		return "", nil, false
	}
	for {
		p, found := line("parent")
		if !found {
			break
		}
		parents = append(parents, p)
	}
	return tree, parents, bytes.HasPrefix(b, []byte("author "))
}
