package cgroup

import "github.com/shimdev/shim/internal/errs"

// Stable error codes carried by *Error. The control API reports them
// verbatim (api.CodeOf finds them through the Code method), so they never
// change meaning.
const (
	// CodeRootRefused: the cgroup root is not one shim may own (the host's
	// top cgroup, or it holds processes or cgroups shim did not create).
	CodeRootRefused = "CGROUP_ROOT_REFUSED"
	// CodeControllerMissing: a limit was asked for whose controller is not
	// available to shim's cgroups.
	CodeControllerMissing = "CONTROLLER_MISSING"
	// CodeFreezeFailed: the kernel did not confirm the freeze (or thaw)
	// before the deadline.
	CodeFreezeFailed = "FREEZE_FAILED"
	// CodeFenceFailed: a group was not empty at the deadline of Kill or
	// WaitEmpty, or a process could not be confirmed gone.
	CodeFenceFailed = "FENCE_FAILED"
	// CodeUnsupported: no fencing mode is usable here (or the forced one
	// is not).
	CodeUnsupported = "UNSUPPORTED"
	// CodeNotFound: Open of a group that does not exist.
	CodeNotFound = "NOT_FOUND"
	// CodeBadRequest: an invalid group name or limit.
	CodeBadRequest = "BAD_REQUEST"
)

// Error is shim's one internal error type (package errs).
type Error = errs.Error

func newError(code string, err error, msg string) *Error { return errs.Wrap(code, err, "%s", msg) }

// CodeOf returns the code of the first *Error in err's chain, or "".
func CodeOf(err error) string { return errs.CodeOf(err) }
