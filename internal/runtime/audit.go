package runtime

import (
	"encoding/json"
	"os"
	"sync"
	"time"
)

// auditLog appends one JSON object a line to audit.jsonl. Fence decisions are
// fsynced before the call returns, so a crash never loses why a generation
// was ended; routine records (credential requests, connections) are not.
type auditLog struct {
	mu sync.Mutex
	f  *os.File
}

func openAudit(path string) (*auditLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &auditLog{f: f}, nil
}

// Record writes one record. sync asks for fsync (fence decisions).
func (a *auditLog) Record(event string, gen uint64, fields map[string]any, sync bool) {
	rec := map[string]any{"time": time.Now().UTC().Format(time.RFC3339Nano), "event": event}
	if gen != 0 {
		rec["generation"] = gen
	}
	for k, v := range fields {
		if _, taken := rec[k]; !taken {
			rec[k] = v
		}
	}
	line, err := json.Marshal(rec)
	if err != nil {
		line, _ = json.Marshal(map[string]any{"time": rec["time"], "event": event, "marshal_error": err.Error()})
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.f.Write(append(line, '\n'))
	if sync {
		a.f.Sync()
	}
}

func (a *auditLog) Close() error { return a.f.Close() }

// Audit records an event of the credential broker or another component
// that knows its generation in fields (never a secret).
func (rt *Runtime) Audit(event string, fields map[string]any) {
	var gen uint64
	if g, ok := fields["generation"].(uint64); ok {
		gen = g
	}
	rt.audit.Record(event, gen, fields, false)
}
