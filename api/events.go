package api

import (
	"encoding/json"
	"time"
)

// Event types of GET /v1/events (Event.Type).
const (
	EventStarted     = "started"      // a generation's harness runs
	EventExited      = "exited"       // a harness exited (on its own or fenced)
	EventQuiesced    = "quiesced"     // after an exit: the rest of the generation was killed
	EventFencing     = "fencing"      // a fence of this generation began
	EventFenced      = "fenced"       // it was fenced
	EventFailed      = "failed"       // a fence or start failed
	EventRemoteMoved = "remote_moved" // the settle-window push check found the remote moved after the fence
	EventShutdown    = "shutdown"     // shim is shutting down
	// EventLeaseExpired: a generation's lease ran out and it was suspended
	// (frozen and cut), or killed where the suspension could not be
	// confirmed.
	EventLeaseExpired = "lease_expired"
	EventResumed      = "resumed" // a renewal resumed a suspended generation
	// EventGap: this reader missed the events From..To (Event.Lost of
	// them); never published, written to the one reader that missed them.
	EventGap = "gap"
)

// Event is one line of the NDJSON stream at GET /v1/events.
type Event struct {
	// Seq numbers the events of this shim from 1, one more per event, so
	// a reader knows what it missed: GET /v1/events?since=SEQ replays
	// what is kept after SEQ. A gap event has no Seq of its own.
	Seq uint64 `json:"seq,omitempty"`
	// Instance names the shim that numbered it (random, new at every
	// start of shim): a reader that resumes passes it with since, and a
	// since of another shim is refused rather than misread.
	Instance   string    `json:"instance,omitempty"`
	Type       string    `json:"type"` // one of the Event* constants
	Generation uint64    `json:"generation"`
	Time       time.Time `json:"time"`
	// Data is what the event says, one type per event type: *StartedData,
	// *ExitedData, *QuiescedData, *FencingData, *FencedData, *FailedData,
	// *RemoteMovedData or *LeaseExpiredData; nil for shutdown, resumed and
	// gap. Decoded, an event type this version does not know keeps its data
	// as a json.RawMessage.
	Data any `json:"data,omitempty"`
	// From, To and Lost are a gap event's: the events From..To (Lost of
	// them) were published and will never reach this reader (it fell
	// behind the kept ring, or asked for a since older than the ring).
	From uint64 `json:"from,omitempty"`
	To   uint64 `json:"to,omitempty"`
	Lost uint64 `json:"lost,omitempty"`
}

// StartedData is a started event's: the harness's pid.
type StartedData struct {
	PID int `json:"pid"`
}

// ExitedData is an exited event's: how the harness ended (as its Exit).
type ExitedData struct {
	ExitCode int  `json:"exit_code"` // 128+signal when killed
	Signal   int  `json:"signal"`
	Fenced   bool `json:"fenced"` // ended by a fence or shutdown, not on its own
}

// QuiescedData is a quiesced event's: how many processes the harness left
// behind were killed.
type QuiescedData struct {
	Killed int `json:"killed"`
}

// FencingData is a fencing event's: the generation whose announcement
// fences this one.
type FencingData struct {
	By uint64 `json:"by"`
}

// FencedData is a fenced event's: as its FenceReport.
type FencedData struct {
	Killed    int `json:"killed"`
	Survivors int `json:"survivors"`
}

// FailedData is a failed event's: why the fence or the start failed, with
// its stable code.
type FailedData struct {
	Error *Error `json:"error"`
}

// RemoteMovedData is a remote_moved event's: the branch's commit at the
// fence and after the settle window.
type RemoteMovedData struct {
	Remote  string `json:"remote"`
	Branch  string `json:"branch"`
	AtFence string `json:"at_fence"`
	Now     string `json:"now"`
}

// LeaseExpiredData is a lease_expired event's: Killed is true when the
// suspension could not be confirmed and the generation was killed.
type LeaseExpiredData struct {
	Killed bool `json:"killed"`
}

// eventData is a new value of the data type of events of type typ, nil for
// a type without data or one this version does not know.
func eventData(typ string) any {
	switch typ {
	case EventStarted:
		return new(StartedData)
	case EventExited:
		return new(ExitedData)
	case EventQuiesced:
		return new(QuiescedData)
	case EventFencing:
		return new(FencingData)
	case EventFenced:
		return new(FencedData)
	case EventFailed:
		return new(FailedData)
	case EventRemoteMoved:
		return new(RemoteMovedData)
	case EventLeaseExpired:
		return new(LeaseExpiredData)
	}
	return nil
}

// UnmarshalJSON decodes an event with its Data as its type's struct.
func (e *Event) UnmarshalJSON(b []byte) error {
	type plain Event // without this method
	var v struct {
		plain
		Data json.RawMessage `json:"data,omitempty"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*e = Event(v.plain)
	e.Data = nil
	if len(v.Data) == 0 || string(v.Data) == "null" {
		return nil
	}
	d := eventData(e.Type)
	if d == nil {
		e.Data = v.Data
		return nil
	}
	if err := json.Unmarshal(v.Data, d); err != nil {
		return err
	}
	e.Data = d
	return nil
}
