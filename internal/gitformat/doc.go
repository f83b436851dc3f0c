// Package gitformat reads and writes git's on-disk formats as shim needs
// them: loose objects, pack indexes (version 2), pack entries and their
// delta chains, deltas, the zlib streams they are stored in, commits' and
// trees' links, C-quoted paths; and writes a pack and its index.
//
// Its parsers read bytes a hostile harness wrote (its commits' objects and
// packs sit in its layer), as root, in PID 1. So every one is bounded, by
// a limit the caller gives or by one named after git's own (with where git
// keeps it), and fails closed: anything malformed is an error or false,
// never a panic, never an allocation past its bound. Each has a fuzz target
// beside it (scripts/fuzz runs them long).
//
// It works on bytes, readers and writers only: where the files are, and
// how they are opened without following a harness's links, is the
// caller's (internal/gitguard). The git cited is git/git at 1a3e64c6
// (2026-08).
package gitformat

import (
	"crypto/sha1"
	"crypto/sha256"
	"errors"
	"hash"
	"strings"
)

// Object types as packs number them and loose headers name them (git's
// enum object_type, object.h). OfsDelta and RefDelta are pack entries
// only: a delta on the entry a distance before it, or on the object named
// after its header.
const (
	Commit   = 1
	Tree     = 2
	Blob     = 3
	Tag      = 4
	OfsDelta = 6
	RefDelta = 7
)

// typeFromName is the type a loose header names ("commit", "tree",
// "blob", "tag"), 0 for any other name (git's type_from_string_gently).
func typeFromName(name string) int {
	switch name {
	case "commit":
		return Commit
	case "tree":
		return Tree
	case "blob":
		return Blob
	case "tag":
		return Tag
	}
	return 0
}

// TypeName is the name a loose header (and an object's hash) gives type
// typ: "commit", "tree", "blob" or "tag" (git's type_name, object.c); ""
// for a pack entry's delta types or any other number.
func TypeName(typ int) string {
	switch typ {
	case Commit:
		return "commit"
	case Tree:
		return "tree"
	case Blob:
		return "blob"
	case Tag:
		return "tag"
	}
	return ""
}

// NewHash is the hash of a repository whose object names have hexLen hex
// digits: SHA-256 for 64, else SHA-1.
func NewHash(hexLen int) hash.Hash {
	if hexLen == 64 {
		return sha256.New()
	}
	return sha1.New()
}

// ErrUnreadable is an object shim does not read alone: missing, of a shape
// it does not read (a delta chain longer than git writes, a base beyond
// reach), past a budget, or corrupt. Git reads it then, and decides.
var ErrUnreadable = errors.New("object not readable by shim")

// isHex reports whether s is lowercase hex digits, at least one (git
// writes object names in lowercase).
func isHex(s string) bool { return s != "" && strings.Trim(s, "0123456789abcdef") == "" }
