package api

// The exec API: tool calls inside a generation (docs/exec.md).

// Codes of the exec API.
const (
	// CodeGenerationSuspended: an exec into a generation whose lease ran
	// out (frozen and cut until a renewal).
	CodeGenerationSuspended = "GENERATION_SUSPENDED"
	// CodeTooManyCalls: the generation already runs MaxCallsPerGeneration
	// tool calls.
	CodeTooManyCalls = "TOO_MANY_CALLS"
	// CodeStdinClosed: a write to a call's stdin after it was closed, or
	// to a call started without stdin.
	CodeStdinClosed = "STDIN_CLOSED"
	// CodeStdinFull: the call did not read its stdin in time; Written
	// bytes of the write were taken.
	CodeStdinFull = "STDIN_FULL"
	// CodeStreamLost (client side): an output stream ended without its
	// exit or fenced frame; re-attach from the offsets read so far.
	CodeStreamLost = "STREAM_LOST"
)

// MaxCallsPerGeneration bounds the tool calls running at once in one
// generation.
const MaxCallsPerGeneration = 256

// ExecRequest runs a tool call in a generation.
// POST /v1/generations/{n}/processes
type ExecRequest struct {
	Command []string `json:"command"`
	// Env is added to the generation's environment (K=V; a key set in
	// both takes the request's value).
	Env []string `json:"env,omitempty"`
	// Cwd defaults to the generation's cwd (its worktree, else /).
	Cwd string `json:"cwd,omitempty"`
	// User ("UID[:GID]" or a name) defaults to the generation's user.
	User string `json:"user,omitempty"`
	// Stdin keeps the call's stdin open for writes (POST .../stdin);
	// without it stdin is StdinData then end of file.
	Stdin     bool   `json:"stdin,omitempty"`
	StdinData []byte `json:"stdin_data,omitempty"`
	// TTY runs it on a pseudo-terminal of Rows x Cols (stderr is the
	// terminal too: one stream, stdout).
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// TimeoutMS kills the call's whole tree (its cgroup) when it runs
	// longer; the record says timed_out.
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Detach answers with the call's record at once (201) instead of
	// streaming its output; attach later (GET .../output).
	Detach bool `json:"detach,omitempty"`
}

// StdinRequest writes to a call's stdin and/or closes it.
// POST /v1/generations/{n}/processes/{id}/stdin
type StdinRequest struct {
	Data  []byte `json:"data,omitempty"`
	Close bool   `json:"close,omitempty"`
}

// StdinResult is how much of a StdinRequest's data the call took.
type StdinResult struct {
	Written int  `json:"written"`
	Closed  bool `json:"closed"`
}

// ResizeRequest sets a TTY call's window size.
// POST /v1/generations/{n}/processes/{id}/resize
type ResizeRequest struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ProcessSignalRequest signals a call: its leader, or (All) every process
// of its cgroup. POST /v1/generations/{n}/processes/{id}/signal
type ProcessSignalRequest struct {
	Signal string `json:"signal"`
	All    bool   `json:"all,omitempty"`
}

// ToolCall is a call a fence found running (FenceReport.ToolCalls).
type ToolCall struct {
	ID         string   `json:"id"`
	Command    []string `json:"command"`
	Pid        int      `json:"pid"`
	DurationMS float64  `json:"duration_ms"` // from its start to the freeze
}
