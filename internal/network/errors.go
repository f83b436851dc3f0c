package network

import (
	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// Error is shim's one internal error type (package errs).
type Error = errs.Error

func errorf(code string, err error, msg string) *Error { return errs.Wrap(code, err, "%s", msg) }

// Codes used by this package (aliases of the api constants).
const (
	// CodeCutFailed: a cut step could not be confirmed; the fence must fail
	// closed.
	CodeCutFailed = api.CodeCutFailed
	// CodeStartFailed: a generation's network could not be built.
	CodeStartFailed = api.CodeStartFailed
	// CodeBadRequest: the configuration or an argument is invalid; nothing
	// was created or changed.
	CodeBadRequest = api.CodeBadRequest
	// CodeUnsupported: the kernel or the sandbox cannot abort sockets at all
	// (no CONFIG_INET_DIAG_DESTROY, no cgroup socket filter, or no
	// CAP_NET_ADMIN). Retrying does not help; the sandbox must change.
	CodeUnsupported = api.CodeUnsupported
)
