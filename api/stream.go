package api

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

// Process is a tool call's record (GET /v1/generations/{n}/processes/{id}).
// Filled in by the exec API's implementation.
type Process struct {
	ID         string `json:"id"`
	Generation uint64 `json:"generation"`
}
