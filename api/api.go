// Package api defines the wire types of shim's control API (HTTP/1.1 + JSON
// over <runtime-dir>/shim.sock, under /v1/) and its stable error codes.
// Supervisors written in Go use these types through package client; other
// languages read the same JSON. Field names are snake_case and only ever grow.
package api

import (
	"errors"
	"fmt"
)

// Stable error codes. They never change meaning once released.
const (
	CodeBadRequest         = "BAD_REQUEST"
	CodeNotFound           = "NOT_FOUND"
	CodeStaleGeneration    = "STALE_GENERATION"
	CodeGenerationConflict = "GENERATION_CONFLICT"
	CodeFenceFailed        = "FENCE_FAILED"
	CodeFreezeFailed       = "FREEZE_FAILED"       // inside a FENCE_FAILED message: the kernel did not confirm the freeze
	CodeCgroupRootRefused  = "CGROUP_ROOT_REFUSED" // shim init: the cgroup root holds something shim did not create
	CodeCutFailed          = "CUT_FAILED"
	CodeAuditFailed        = "AUDIT_FAILED"        // a fence decision could not be written to audit.jsonl: fail closed
	CodeTokenNotPersisted  = "TOKEN_NOT_PERSISTED" // the fencing token could not be written to state.json: old generations are fenced, nothing starts
	CodeRestoreFailed      = "RESTORE_FAILED"
	CodeWorktreeRefused    = "WORKTREE_REFUSED"
	CodeStartFailed        = "START_FAILED"
	CodePeerNotAllowed     = "PEER_NOT_ALLOWED"
	CodeNotRunning         = "NOT_RUNNING"
	CodeGenerationLive     = "GENERATION_LIVE" // shim ctl register while a generation runs: register at setup, or name the worktree in an announcement
	CodeControllerMissing  = "CONTROLLER_MISSING"
	CodeUnsupported        = "UNSUPPORTED"
	CodeShuttingDown       = "SHUTTING_DOWN"
	// CodeIsolationUnavailable: the announcement (or shim init
	// --require-isolation) asked for copy-on-write layers and this sandbox
	// cannot give them (Status.Isolation says why).
	CodeIsolationUnavailable = "ISOLATION_UNAVAILABLE"
	// CodeNotCurrent: the announcement's if_current named a generation
	// that is no longer the highest announced; nothing was fenced.
	CodeNotCurrent  = "NOT_CURRENT"
	CodeInternal    = "INTERNAL"
	CodeUnreachable = "UNREACHABLE" // client side only: the shim could not be reached
	// CodeOutcomeUnknown (client side only): the caller's deadline or
	// cancel ended the call after it was sent: shim may have done it all.
	// Retry with the same generation and spec (an identical retry is
	// answered with the first outcome, replayed true).
	CodeOutcomeUnknown = "OUTCOME_UNKNOWN"
	// CodeWaitTimeout (shim ctl wait --timeout, and a client's wait its
	// caller's deadline or cancel ended): the generation had not exited
	// when the timeout ran out; it still runs. A wait changes nothing:
	// nothing to retry but the wait.
	CodeWaitTimeout = "WAIT_TIMEOUT"
	// CodeNotAnnounced: an end named a generation above the highest ever
	// announced (a typo would otherwise fence whatever runs and raise the
	// token to it); nothing was fenced. EndRequest.Force ends it anyway.
	CodeNotAnnounced = "NOT_ANNOUNCED"
	// CodeMethodNotAllowed: the path exists, not with this HTTP method
	// (HTTP 405, the Allow header lists the methods it has).
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
)

// MaxGeneration is the highest generation shim accepts: 2^53-1, the
// largest integer every JSON client (JavaScript's numbers, a double)
// holds exactly. A higher one is BAD_REQUEST in every request, before
// anything is fenced: persisted, it would leave no generation above it.
const MaxGeneration = 1<<53 - 1

// Error is the JSON error body of every failed API call and the stderr line
// of a failed `shim ctl`.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Errorf builds an *Error with a stable code.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Coder is implemented by errors of the internal packages that carry a stable
// code; CodeOf finds it anywhere in an error chain.
type Coder interface{ Code() string }

// CodeOf returns the stable code of err, or CodeInternal when it has none.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var c Coder
	if errors.As(err, &c) {
		return c.Code()
	}
	return CodeInternal
}
