package gitformat

// Refs: a loose ref's file, the packed-refs file, and the names git
// accepts for them.

import (
	"bytes"
	"strings"
)

// IsObjectName reports whether s is a full object name: 40 (SHA-1) or 64
// (SHA-256) lowercase hex digits.
func IsObjectName(s string) bool { return (len(s) == 40 || len(s) == 64) && isHex(s) }

// ValidRefName is git's check-ref-format for a full name under refs/
// (check_refname_format, refs.c): no component empty, starting with a
// dot or ending in ".lock"; no "..", "@{", "//", control character,
// space, or any of ~^:?*[\; not ending in "/" or ".".
func ValidRefName(n string) bool {
	if !strings.HasPrefix(n, "refs/") || strings.HasSuffix(n, "/") || strings.HasSuffix(n, ".") ||
		strings.Contains(n, "..") || strings.Contains(n, "@{") || strings.Contains(n, "//") {
		return false
	}
	for _, c := range strings.Split(n, "/") {
		if c == "" || c[0] == '.' || strings.HasSuffix(c, ".lock") {
			return false
		}
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; c <= ' ' || c == 0x7f || strings.IndexByte("~^:?*[\\", c) >= 0 {
			return false
		}
	}
	return true
}

// ParseRefValue reads a loose ref's file: an object name, or "ref: "
// and the name of a ref under refs/ (or HEAD), one newline after it at
// most (git's parse_loose_ref_contents, refs/files-backend.c, is more
// lenient: shim takes only what git writes). It returns the value as
// read and whether it is one of those.
func ParseRefValue(data []byte) (string, bool) {
	s := strings.TrimSuffix(string(data), "\n")
	if t, ok := strings.CutPrefix(s, "ref: "); ok {
		return "ref: " + t, ValidRefName(t) || t == "HEAD"
	}
	return s, IsObjectName(s)
}

// ParsePackedRefs calls add with each ref of a packed-refs file (object
// name, a space, ref name, a line each; refs/packed-backend.c) until add
// returns false. The header ("# pack-refs with: ..."), peeled lines
// ("^" and the object a tag points to) and any line that is not a ref of
// a valid name are skipped. It reads data in place: the caller bounds
// its size.
func ParsePackedRefs(data []byte, add func(name, oid string) bool) {
	for len(data) > 0 {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		if len(line) == 0 || line[0] == '#' || line[0] == '^' {
			continue
		}
		oid, name, ok := bytes.Cut(line, []byte{' '})
		if !ok || !IsObjectName(string(oid)) || !ValidRefName(string(name)) {
			continue
		}
		if !add(string(name), string(oid)) {
			return
		}
	}
}
