package gitformat

import "fmt"

// A Budget bounds the bytes a series of reads inflates (loose objects,
// pack entries, deltas and their bases, and the copies deltas make): a
// tree whose every entry is a delta chain of a large base costs its
// reader the budget, not its memory. Zero is no bound; once spent it is
// negative, and every later charge fails.
type Budget int64

// Charge takes n bytes from the budget, if it has one; past it, an
// ErrUnreadable.
func (b *Budget) Charge(n uint64) error {
	if b == nil || *b == 0 {
		return nil
	}
	if *b < 0 || n >= uint64(*b) {
		*b = -1
		return fmt.Errorf("%w: more bytes to inflate than the read's budget", ErrUnreadable)
	}
	*b -= Budget(n)
	return nil
}

// spent reports whether a bounded budget is used up.
func (b *Budget) spent() bool { return b != nil && *b < 0 }
