// Package errs is the one error type of shim's internal packages: a stable
// upper-case code (api's Code* constants), a message, and the cause. Every
// package returns it (cgroup, network, gitguard and creds alias it as their
// Error), api.CodeOf finds the code anywhere in a chain through its Code
// method, and the control API reports Code and Error() as they are: the
// message never repeats the code.
package errs

import (
	"errors"
	"fmt"
)

// Error is an error with a stable code.
type Error struct {
	code string
	msg  string
	err  error
}

// New is an error with code and a message made from format and args.
func New(code, format string, args ...any) *Error {
	return &Error{code: code, msg: fmt.Sprintf(format, args...)}
}

// Wrap is New with cause as the underlying error (errors.Is and As see
// it; Error() appends it).
func Wrap(code string, cause error, format string, args ...any) *Error {
	return &Error{code: code, msg: fmt.Sprintf(format, args...), err: cause}
}

// Code is the stable upper-case code, e.g. "FENCE_FAILED".
func (e *Error) Code() string { return e.code }

// Error is the message, then ": " and the cause when there is one.
func (e *Error) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.err }

// CodeOf is the code of the first *Error in err's chain, or "".
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.code
	}
	return ""
}
