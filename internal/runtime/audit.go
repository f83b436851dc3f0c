package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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
	// Rotation (guarded by mu): past maxBytes (0: never) audit.jsonl
	// becomes audit.jsonl.1 (the older ones shift, keep are kept) and the
	// new file begins with an audit_rotated record that carries highest,
	// the durable fencing token, so that the token's floor can always be
	// read from the current file (floor.go) whatever was rotated away.
	path     string
	size     int64
	maxBytes int64
	keep     int
	highest  uint64
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
	a := &auditLog{f: f, reserve: r, path: path}
	if fi, err := f.Stat(); err == nil {
		a.size = fi.Size()
	}
	return a, nil
}

// rotateAt turns rotation on: past max bytes, keep rotated files are kept.
// highest is the fencing token now; the log raises it with every
// "announced" record it writes.
func (a *auditLog) rotateAt(max int64, keep int, highest uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.maxBytes, a.keep, a.highest = max, keep, highest
}

// rotateLocked rotates once the file is past maxBytes; a.mu held. The
// rotated record is synced like a fence decision: it is the token's floor
// in the new file. A rotation that fails leaves the current file in use.
func (a *auditLog) rotateLocked() {
	if a.maxBytes <= 0 || a.size < a.maxBytes || a.path == "" {
		return
	}
	keep := max(a.keep, 1)
	os.Remove(a.path + "." + strconv.Itoa(keep))
	for i := keep - 1; i >= 1; i-- {
		os.Rename(a.path+"."+strconv.Itoa(i), a.path+"."+strconv.Itoa(i+1))
	}
	if err := os.Rename(a.path, a.path+".1"); err != nil {
		return
	}
	f, err := os.OpenFile(a.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		// Keep writing to the renamed file: nothing is lost, only not
		// rotated.
		return
	}
	a.f.Close()
	a.f, a.size = f, 0
	line, _ := json.Marshal(map[string]any{"time": time.Now().UTC().Format(time.RFC3339Nano), "event": "audit_rotated",
		"highest": a.highest, "previous": filepath.Base(a.path) + ".1"})
	line = append(line, '\n')
	if err := a.reserve.retry(func() error {
		if _, err := a.f.Write(line); err != nil {
			return err
		}
		return fsync(a.f)
	}); err == nil {
		a.size += int64(len(line))
	}
	if d, err := os.Open(filepath.Dir(a.path)); err == nil {
		fsync(d)
		d.Close()
	}
}

// auditFiles are audit.jsonl and its rotated files that exist, newest
// first.
func auditFiles(runtimeDir string) []string {
	base := filepath.Join(runtimeDir, "audit.jsonl")
	out := []string{base}
	matches, _ := filepath.Glob(base + ".*")
	nums := []int{}
	for _, m := range matches {
		if n, err := strconv.Atoi(m[len(base)+1:]); err == nil && n > 0 {
			nums = append(nums, n)
		}
	}
	for i := 1; len(nums) > 0 && i <= maxRotated; i++ {
		for _, n := range nums {
			if n == i {
				out = append(out, fmt.Sprintf("%s.%d", base, n))
			}
		}
	}
	return out
}

// maxRotated bounds the rotated audit files read (Config.AuditKeep's limit).
const maxRotated = 100

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
	if event == "announced" && gen > a.highest {
		a.highest = gen
	}
	write := func() error {
		if _, err := a.f.Write(line); err != nil {
			return err
		}
		if sync {
			return fsync(a.f)
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
	a.size += int64(len(line))
	a.rotateLocked()
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
