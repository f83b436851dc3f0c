package network

import "github.com/shimdev/shim/api"

// Error is an error of this package with a stable code, so that a fence
// report can say why a cut failed in a form a supervisor can act on
// (api.CodeOf finds it through the Code method). Messages never contain a
// secret or a request's query string.
type Error struct {
	code string
	msg  string
	err  error
}

// Error returns the message followed by its cause, if any.
func (e *Error) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

// Code returns the stable upper-case code, e.g. "CUT_FAILED".
func (e *Error) Code() string { return e.code }

// Unwrap returns the underlying cause (a syscall.Errno, for example).
func (e *Error) Unwrap() error { return e.err }

func errorf(code string, err error, msg string) *Error {
	return &Error{code: code, msg: msg, err: err}
}

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
