package gitformat

import (
	"bytes"
	"encoding/hex"
)

// TreeEntries calls f with each entry of a tree object's bytes (MODE, a
// space, NAME, a NUL, then the raw object name of hashLen bytes) until f
// returns false; false when f did, or when the bytes are not a tree: an
// empty mode or name, or an entry cut short (git's decode_tree_entry,
// tree-walk.c: "too-short tree object"). The mode is as written; reading
// it is the caller's.
func TreeEntries(b []byte, hashLen int, f func(mode, id string) bool) bool {
	return ReadTree(b, hashLen, func(mode, _, id []byte) bool { return f(string(mode), hex.EncodeToString(id)) })
}

// ReadTree is TreeEntries with each entry's name, and its mode and raw
// object name as the tree's bytes hold them (valid only during the call).
func ReadTree(b []byte, hashLen int, f func(mode, name, id []byte) bool) bool {
	for len(b) > 0 {
		sp := bytes.IndexByte(b, ' ')
		if sp <= 0 {
			return false
		}
		nul := bytes.IndexByte(b[sp:], 0)
		if nul < 2 || len(b) < sp+nul+1+hashLen {
			return false
		}
		if !f(b[:sp], b[sp+1:sp+nul], b[sp+nul+1:sp+nul+1+hashLen]) {
			return false
		}
		b = b[sp+nul+1+hashLen:]
	}
	return true
}
