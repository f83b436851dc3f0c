package gitguard

import (
	"bytes"
	"context"
	"strconv"
	"strings"
)

// describe fills the report's path list, counts, nested repositories,
// ignored files and local commits (objects only; runs beside the reset).
func (g *Guard) describe(ctx context.Context, s *snap, rep *Report) error {
	return parallel(
		func() error {
			// The snapshot's tree is the temporary index, unless an
			// existing snapshot that holds more was kept.
			out := s.diff
			if s.reused {
				var err error
				if out, err = g.git(ctx, gitOpts{}, "diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-abbrev", s.baselineTree, s.commit); err != nil {
					return err
				}
			}
			fillChanges(out, &rep.Paths, &rep.PathsTruncated, &rep.Modified, &rep.Added, &rep.Deleted, &rep.NestedRepos)
			return nil
		},
		func() error {
			for _, p := range bytes.Split(s.ignored, []byte{0}) {
				if len(p) == 0 || g.isKept(string(p)) {
					continue
				}
				if len(rep.Ignored) >= maxListed {
					rep.IgnoredTruncated = true
					break
				}
				rep.Ignored = append(rep.Ignored, string(p))
			}
			var heads []string
			for _, p := range s.parents {
				if p != s.baseline {
					heads = append(heads, p)
				}
			}
			if len(heads) == 0 {
				return nil
			}
			args := append(append([]string{"rev-list", "--count"}, heads...), "--not", s.baseline)
			out, err := g.git(ctx, gitOpts{}, args...)
			if err != nil {
				return err
			}
			rep.LocalCommits, err = strconv.Atoi(strings.TrimSpace(string(out)))
			return err
		},
	)
}

// fillChanges parses `diff-tree -r -z --raw` output.
func fillChanges(out []byte, paths *[]PathChange, truncated *bool, modified, added, deleted *int, nested *[]string) {
	f := bytes.Split(out, []byte{0})
	for i := 0; i+1 < len(f); i += 2 {
		fillChange(f[i], string(f[i+1]), paths, truncated, modified, added, deleted, nested)
	}
}

// fillChange adds one change of `diff-tree -r -z --raw` output: its
// record (":MODE MODE OID OID STATUS") and its path.
func fillChange(rec []byte, path string, paths *[]PathChange, truncated *bool, modified, added, deleted *int, nested *[]string) {
	meta := strings.Fields(strings.TrimPrefix(string(rec), ":"))
	if len(meta) < 5 {
		return
	}
	var change string
	switch meta[4][0] {
	case 'A':
		*added++
		change = "added"
	case 'D':
		*deleted++
		change = "deleted"
	case 'T':
		*modified++
		change = "type_changed"
	default:
		*modified++
		change = "modified"
	}
	if meta[1] == "160000" && meta[0] != "160000" && nested != nil {
		*nested = append(*nested, path)
	}
	if len(*paths) >= maxListed {
		*truncated = true
		return
	}
	*paths = append(*paths, PathChange{Path: path, Change: change})
}

// A recordWriter hands fn each record of what is written to it (each
// ended by sep) as it comes, holding at most max bytes of one (a longer
// one is cut): git's output read as it is written, never held whole. fn
// may keep a record's bytes only as a copy.
type recordWriter struct {
	sep  byte
	max  int
	fn   func([]byte) error
	part []byte
}

func (w *recordWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, w.sep)
		if i < 0 {
			w.part = append(w.part, p[:min(len(p), max(0, w.max-len(w.part)))]...)
			break
		}
		rec := p[:i]
		if len(w.part) > 0 {
			w.part = append(w.part, rec[:min(len(rec), max(0, w.max-len(w.part)))]...)
			rec = w.part
		}
		if err := w.fn(rec[:min(len(rec), w.max)]); err != nil {
			return 0, err
		}
		w.part, p = w.part[:0], p[i+1:]
	}
	return n, nil
}
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
