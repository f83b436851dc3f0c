package runtime

import (
	"encoding/json"
	"os"
	"sync"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// auditLog appends one JSON object a line to audit.jsonl. Fence decisions are
// fsynced before the call returns, so a crash never loses why a generation
// was ended; routine records (credential requests, connections) are not.
// Out of space, a write gives up the runtime dir's reserve and tries again.
type auditLog struct {
	mu      sync.Mutex
	f       *os.File
	reserve *reserve
	// Routine records are rate-limited per event and generation
	// (routineBurst a second): they are what a harness causes, and garbage
	// sent to cred.sock in a loop must not grow the log without bound.
	// Guarded by mu.
	limits map[limitKey]*limit
}

type limitKey struct {
	event string
	gen   uint64
}

type limit struct {
	window     time.Time
	inWindow   int
	suppressed uint64
}

// routineBurst is how many routine records of one event and generation a
// second are written; the rest are counted, and the next one written says
// how many were suppressed before it. Credential grants are never
// suppressed: only the current generation gets one, and each is evidence.
const routineBurst = 50

func openAudit(path string, r *reserve) (*auditLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &auditLog{f: f, reserve: r}, nil
}

// Record writes one record. sync asks for fsync (fence decisions). The
// error (AUDIT_FAILED) matters for fence decisions: one that cannot be
// recorded fails the announcement closed.
func (a *auditLog) Record(event string, gen uint64, fields map[string]any, sync bool) error {
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
	if !sync && event != "credential_granted" {
		if a.limits == nil {
			a.limits = map[limitKey]*limit{}
		}
		k := limitKey{event, gen}
		l := a.limits[k]
		if l == nil {
			l = &limit{}
			a.limits[k] = l
		}
		now := time.Now()
		if now.Sub(l.window) >= time.Second {
			l.window, l.inWindow = now, 0
		}
		if l.inWindow >= routineBurst {
			l.suppressed++
			return nil
		}
		l.inWindow++
		if l.suppressed > 0 {
			rec["suppressed_before"] = l.suppressed
			l.suppressed = 0
			if line, err = json.Marshal(rec); err != nil {
				return nil
			}
		}
	}
	line = append(line, '\n')
	write := func() error {
		if _, err := a.f.Write(line); err != nil {
			return err
		}
		if sync {
			return a.f.Sync()
		}
		return nil
	}
	if sync {
		// Only fence decisions may use the reserve: routine records are
		// what a harness causes (credential requests, connections), and
		// it must not be able to spend the space the fence needs.
		err = a.reserve.retry(write)
	} else {
		err = write() // a routine record lost to a full filesystem is only that
	}
	if err != nil {
		return errs.New(api.CodeAuditFailed, "audit record %s: %v", event, err)
	}
	return nil
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
