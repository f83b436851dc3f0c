package api

import "time"

// Streams of bytes (a tool call's output, a generation's logs) travel as
// NDJSON (Content-Type application/x-ndjson): one Frame per line, so every
// client reads them with its standard library (a line reader, a JSON
// decoder, base64). A stream ends with a frame of type "exit", "fenced" or
// "end"; a connection that closes without one ended early (re-attach from
// the offsets read so far).

// Frame types.
const (
	FrameStarted = "started" // a tool call began: ID, PID
	FrameStdout  = "stdout"  // Data (base64 in JSON) at Offset of stdout
	FrameStderr  = "stderr"  // Data at Offset of stderr
	FrameDropped = "dropped" // Bytes of Stream were not kept (past the cap, or a reader too slow): the next Offset says where the stream resumes
	FrameExit    = "exit"    // the process ended: Process holds its record
	FrameFenced  = "fenced"  // its generation was fenced: Process holds its record (killed by the fence)
	FrameEnd     = "end"     // a non-following read reached what is kept so far
)

// Frame is one line of an output stream.
type Frame struct {
	Type string `json:"type"`
	// Stream is "stdout" or "stderr" for a dropped frame.
	Stream string `json:"stream,omitempty"`
	// Offset is where Data (or, for dropped, the resumed stream) starts,
	// in bytes of that stream since the process began.
	Offset int64  `json:"offset,omitempty"`
	Data   []byte `json:"data,omitempty"`
	Bytes  int64  `json:"bytes,omitempty"`
	// ID and PID: the tool call, on its started frame.
	ID  string `json:"id,omitempty"`
	PID int    `json:"pid,omitempty"`
	// Process is the call's record on exit and fenced frames.
	Process *Process `json:"process,omitempty"`
	// Exit is the generation's exit record on the exit and fenced frames
	// of its logs (GET /v1/generations/{n}/logs?follow=1).
	Exit *Exit `json:"exit,omitempty"`
}

// Process is a tool call's record (GET /v1/generations/{n}/processes/{id},
// and gen/<N>/proc/<K>/process.json).
type Process struct {
	ID         string            `json:"id"`
	Generation uint64            `json:"generation"`
	Pid        int               `json:"pid,omitempty"`
	Command    []string          `json:"command"`
	Cwd        string            `json:"cwd,omitempty"`
	User       string            `json:"user,omitempty"`
	TTY        bool              `json:"tty,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Cgroup     string            `json:"cgroup,omitempty"`
	// State is "running" or "exited" (ExitCode and Signal say how; Fenced
	// when its generation's fence ended it).
	State     string     `json:"state"`
	StartedAt time.Time  `json:"started_at"`
	ExitedAt  *time.Time `json:"exited_at,omitempty"`
	ExitCode  *int       `json:"exit_code,omitempty"` // 128+signal when killed
	Signal    int        `json:"signal,omitempty"`
	// TimedOut: its timeout ran out and its whole tree was killed (the
	// CLI exits 124, as coreutils timeout).
	TimedOut  bool  `json:"timed_out,omitempty"`
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Fenced: its generation was fenced (or ended) while it ran; it was
	// frozen, cut and killed with it.
	Fenced bool `json:"fenced,omitempty"`
	// StdoutBytes and StderrBytes are the bytes it wrote to each stream;
	// StdoutKept and StderrKept the bytes kept in the files (at most
	// --exec-output-max each); the rest was dropped.
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	StdoutKept  int64  `json:"stdout_kept"`
	StderrKept  int64  `json:"stderr_kept"`
	Stdout      string `json:"stdout,omitempty"` // file path in the runtime dir
	Stderr      string `json:"stderr,omitempty"`
	// Leftover is how many of its processes still ran when its leader
	// exited (they go on in its cgroup until killed or fenced).
	Leftover int `json:"leftover,omitempty"`
}

// Process states.
const (
	ProcessRunning = "running"
	ProcessExited  = "exited"
)
