// Package snapshot turns a worktree layer (an overlay's upper directory
// over a checkout at a baseline commit) into a git commit: the layer's
// tree on the baseline's, whiteouts as deletions, opaque directories
// replacing the baseline's.
//
// A Walk reads the layer, as root, in PID 1, where a hostile harness
// shaped it: it holds a few descriptors and no path per level, follows no
// link, reads no FIFO, and stores only what git and the kernel can use
// again (its Bounds); what it does not store it hands to a callback. Each
// change it finds goes to a Sink as a typed value: Import applies them to
// the baseline's trees (read from a Store) and writes the new objects into
// one pack as they come; Stream writes them for git fast-import, which
// imports what Import does not take (ErrNotHere).
//
// Which commit is made, with which parents and under which ref, and
// whether the harness's history is whole, is the caller's
// (internal/gitguard): this package writes objects, never a ref.
package snapshot
