package gitguard

import (
	"errors"
	"fmt"

	"github.com/shimdev/shim/internal/gitformat"
	"golang.org/x/sys/unix"
)

// Reading the ref namespace (refspace.go says what it is for) as the
// files backend keeps it: loose refs, reflogs and packed-refs, within
// bounds a harness cannot move.

// The ref namespace's bounds. In the scan mode a harness writes refs/,
// logs/ and packed-refs, and shim reads them in PID 1: packed-refs is read
// up to maxPackedRefs bytes, a read of the namespace looks at maxRefs
// entries at most (loose refs, their directories, reflogs and packed refs
// together) maxRefDepth directories deep at most, and a restore saves at
// most maxSavedRefs of the harness's refs. Past a bound a restore treats
// the rest as not a ref (removed, counted in the report) and the trusted
// refs come back; a registration refuses the repository
// (WORKTREE_REFUSED) rather than trust a namespace it did not read whole.
const (
	maxPackedRefs = 64 << 20
	maxRefDepth   = 32
)

// Variables so that a test can push past them in seconds.
var (
	maxRefs      = 1 << 17
	maxSavedRefs = 1 << 14
)

// errTooManyRefs is a ref namespace past maxRefs or maxRefDepth.
var errTooManyRefs = errors.New("more refs than shim reads (131,072 entries, 32 directories deep)")

// refRead is what readRefs found.
type refRead struct {
	refs refSet
	// bad lists (at most maxListed; badTruncated past that) what was not
	// a ref, or past the bounds, relative to the git dir.
	bad          []string
	badTruncated bool
	repaired     []string
}

// readRefs reads the loose refs and packed-refs. Entries that are not refs
// (a FIFO, socket or symlink, an unreadable or malformed file, an invalid
// name, anything past the bounds) are removed and listed in bad, relative
// to the git dir; so are special files under logs/. Directories of refs/
// and logs/ the owner cannot enter or write are made u+rwx (as the owner).
// Without fix nothing is removed and a namespace past the bounds is
// errTooManyRefs.
func (g *Guard) readRefs(gfd int, fix bool) (refRead, error) {
	w := &refWalk{refs: refSet{}, fix: fix}
	rfd, err := openDirAt(gfd, "refs")
	if err != nil {
		return refRead{}, err
	}
	err = w.walk(rfd, "refs", true, 0)
	unix.Close(rfd)
	if err != nil {
		return refRead{}, err
	}
	if lfd, err := openDirAt(gfd, "logs"); err == nil {
		err = w.walk(lfd, "logs", false, 0)
		unix.Close(lfd)
		if err != nil {
			return refRead{}, err
		}
	}
	packed, err := readPacked(gfd, maxRefs-w.seen)
	if err != nil && !isNotExist(err) {
		if !fix && errors.Is(err, errTooManyRefs) {
			return refRead{}, fmt.Errorf("packed-refs: %w", err)
		}
		// What was read of it stays (the harness's refs are saved), the
		// file goes: the trusted namespace is written back whole.
		if err := w.refuse(gfd, "packed-refs", "packed-refs"); err != nil {
			return refRead{}, err
		}
	}
	for n, v := range packed {
		if _, loose := w.refs[n]; !loose {
			w.refs[n] = v
		}
	}
	out := refRead{refs: w.refs, bad: w.bad, badTruncated: w.badTruncated}
	if !fix {
		return out, nil
	}
	out.repaired, err = g.repairDirs(gfd, w.dirs)
	return out, err
}

// refWalk is one pass over refs/ (or logs/).
type refWalk struct {
	fix          bool // remove what is not a ref (else only list it)
	refs         refSet
	bad          []string
	badTruncated bool
	dirs         []string // directories (relative to the git dir) the owner cannot use
	seen         int      // entries looked at, against maxRefs
}

func (w *refWalk) walk(fd int, rel string, refs bool, depth int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err == nil && st.Mode&0o700 != 0o700 && len(w.dirs) < maxListed {
		w.dirs = append(w.dirs, rel)
	}
	return eachDirEntry(fd, func(n string) error {
		c := rel + "/" + n
		if w.seen++; w.seen > maxRefs || depth >= maxRefDepth {
			if !w.fix {
				return fmt.Errorf("%s: %w", c, errTooManyRefs)
			}
			return w.refuse(fd, n, c)
		}
		st, err := lstatAt(fd, n)
		if err != nil {
			if isNotExist(err) {
				return nil
			}
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			sub, err := openDirAt(fd, n)
			if err != nil {
				return err
			}
			err = w.walk(sub, c, refs, depth+1)
			unix.Close(sub)
			return err
		case unix.S_IFREG:
			if !refs {
				return nil // a reflog: git only appends to it
			}
			data, _, err := readFileAt(fd, n, 4096)
			v, ok := gitformat.ParseRefValue(data)
			if err == nil && ok && gitformat.ValidRefName(c) {
				w.refs[c] = v
				return nil
			}
		}
		return w.refuse(fd, n, c)
	})
}

// refuse lists c (at most maxListed names) and removes it.
func (w *refWalk) refuse(dirfd int, name, c string) error {
	if len(w.bad) < maxListed {
		w.bad = append(w.bad, c)
	} else {
		w.badTruncated = true
	}
	return w.remove(dirfd, name)
}

func (w *refWalk) remove(dirfd int, name string) error {
	if !w.fix {
		return nil
	}
	return removeAllAt(dirfd, name)
}

// readPacked parses packed-refs (object id, space, name; peeled "^" lines
// and the header are skipped, as is any line that is not a ref): at most
// maxPackedRefs bytes and budget refs (errTooManyRefs, with the refs read
// so far).
func readPacked(gfd int, budget int) (refSet, error) {
	data, _, err := readFileAt(gfd, "packed-refs", maxPackedRefs)
	if err != nil {
		return nil, err
	}
	out := refSet{}
	gitformat.ParsePackedRefs(data, func(name, oid string) bool {
		if len(out) >= budget {
			err = errTooManyRefs
			return false
		}
		out[name] = oid
		return true
	})
	return out, err
}
