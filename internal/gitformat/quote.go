package gitformat

import (
	"errors"
	"strconv"
	"strings"
)

// errQuoted is a path quoted otherwise than git quotes it.
var errQuoted = errors.New("a path quoted otherwise")

// UnquotePath reads a path as git quotes it, C style in double quotes
// (quote_c_style, quote.c: \" and \\, and any byte as three octal
// digits); a path without quotes is taken as it is. The result is never
// longer than q.
func UnquotePath(q string) (string, error) {
	s, ok := strings.CutPrefix(q, `"`)
	if !ok {
		return q, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			if i != len(s)-1 {
				break
			}
			return b.String(), nil
		case c != '\\':
			b.WriteByte(c)
			continue
		case i+1 < len(s) && (s[i+1] == '\\' || s[i+1] == '"'):
			b.WriteByte(s[i+1])
			i++
			continue
		case i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]):
			v, _ := strconv.ParseUint(s[i+1:i+4], 8, 8)
			b.WriteByte(byte(v))
			i += 3
			continue
		}
		return "", errQuoted
	}
	return "", errQuoted
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// QuotePath is path p as git fast-import reads any byte of it: in double
// quotes, C style, a quote and a backslash escaped and every other control
// character in octal (what UnquotePath reads back).
func QuotePath(p string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			b.WriteByte('\\')
			b.WriteString(strconv.FormatUint(uint64(c)|0o1000, 8)[1:])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
