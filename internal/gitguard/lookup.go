package gitguard

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strings"
)

// objInfo is one answer of cat-file --batch-check ("" type when missing).
type objInfo struct{ oid, typ string }

func (g *Guard) lookup(ctx context.Context, queries []string) ([]objInfo, error) {
	in := strings.Join(queries, "\n") + "\n"
	out, err := g.git(ctx, gitOpts{stdin: strings.NewReader(in)}, "cat-file", "--batch-check")
	if err != nil {
		return nil, err
	}
	res := make([]objInfo, 0, len(queries))
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && isHex(f[0]) {
			res = append(res, objInfo{oid: f[0], typ: f[1]})
		} else {
			res = append(res, objInfo{})
		}
	}
	if len(res) != len(queries) {
		return nil, fmt.Errorf("cat-file answered %d of %d lookups", len(res), len(queries))
	}
	return res, nil
}

// validRev accepts a revision for git: no option look-alike, no whitespace
// or control characters (they would break cat-file's line protocol).
func validRev(rev string) error {
	if rev == "" || len(rev) > 1024 || strings.HasPrefix(rev, "-") {
		return errorf(CodeBadRequest, nil, "invalid revision %q", rev)
	}
	for _, r := range rev {
		if r <= ' ' || r == 0x7f {
			return errorf(CodeBadRequest, nil, "invalid revision %q", rev)
		}
	}
	return nil
}
