package cgroup

import (
	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// Codes carried by *Error: the control API's (package api), which reports
// them verbatim (api.CodeOf finds them through the Code method).
const (
	// CodeRootRefused: the cgroup root is not one shim may own (the host's
	// top cgroup, or it holds processes or cgroups shim did not create).
	CodeRootRefused = api.CodeCgroupRootRefused
	// CodeControllerMissing: a limit was asked for whose controller is not
	// available to shim's cgroups.
	CodeControllerMissing = api.CodeControllerMissing
	// CodeFreezeFailed: the kernel did not confirm the freeze (or thaw)
	// before the deadline.
	CodeFreezeFailed = api.CodeFreezeFailed
	// CodeFenceFailed: a group was not empty at the deadline of Kill or
	// WaitEmpty, or a process could not be confirmed gone.
	CodeFenceFailed = api.CodeFenceFailed
	// CodeUnsupported: no fencing mode is usable here (or the forced one
	// is not).
	CodeUnsupported = api.CodeUnsupported
	// CodeNotFound: Open of a group that does not exist.
	CodeNotFound = api.CodeNotFound
	// CodeBadRequest: an invalid group name or limit.
	CodeBadRequest = api.CodeBadRequest
)

// Error is shim's one internal error type (package errs).
type Error = errs.Error

func newError(code string, err error, msg string) *Error { return errs.Wrap(code, err, "%s", msg) }

// CodeOf returns the code of the first *Error in err's chain, or "".
func CodeOf(err error) string { return errs.CodeOf(err) }
