package creds

import "github.com/shimdev/shim/api"

// Error is an error of this package with a stable code (api.CodeOf finds it).
// Messages never contain a secret.
type Error struct {
	code string
	msg  string
	err  error
}

func (e *Error) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

// Code returns the stable upper-case code, e.g. "CUT_FAILED".
func (e *Error) Code() string { return e.code }

func (e *Error) Unwrap() error { return e.err }

func errorf(code string, err error, msg string) *Error {
	return &Error{code: code, msg: msg, err: err}
}

// Codes used by this package (aliases of the api constants).
const (
	CodeCutFailed   = api.CodeCutFailed
	CodeStartFailed = api.CodeStartFailed
	CodeBadRequest  = api.CodeBadRequest
)
