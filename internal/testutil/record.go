package testutil

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// AuditLog records audit callbacks (func(event, fields)) as a component
// would write them, for tests to search.
type AuditLog struct {
	mu   sync.Mutex
	recs []map[string]any
	raw  bytes.Buffer
}

// Record is the audit callback.
func (a *AuditLog) Record(event string, fields map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := map[string]any{"event": event}
	for k, v := range fields {
		rec[k] = v
	}
	b, _ := json.Marshal(rec)
	a.raw.Write(append(b, '\n'))
	var back map[string]any
	_ = json.Unmarshal(b, &back)
	a.recs = append(a.recs, back)
}

// Find returns the records of event, as JSON would carry them.
func (a *AuditLog) Find(event string) []map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []map[string]any
	for _, r := range a.recs {
		if r["event"] == event {
			out = append(out, r)
		}
	}
	return out
}

// Bytes is every record, one JSON line each.
func (a *AuditLog) Bytes() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]byte(nil), a.raw.Bytes()...)
}

// SyncBuffer is a goroutine-safe log sink.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// Bytes is what was written so far.
func (s *SyncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b.Bytes()...)
}

// Logger is a trace-level logger writing to w.
func Logger(w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "test", Output: w, Level: hclog.Trace})
}
