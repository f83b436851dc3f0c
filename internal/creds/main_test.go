package creds

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/shimdev/shim/internal/testutil"
)

// The test binary is also `shim credential` (git runs it as its credential
// helper) when envTestMode is "helper"; otherwise it runs the tests.
const (
	envTestMode = "SHIM_CREDS_TEST_MODE"
)

func TestMain(m *testing.M) {
	if os.Getenv(envTestMode) == "helper" {
		os.Exit(HelperMain(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv))
	}
	os.Exit(m.Run())
}

// requireTool skips (or fails) when a program is missing.
func requireTool(t testing.TB, name string) string { t.Helper(); return testutil.NeedTool(t, name) }

// auditLog collects audit records (as JSON, as the runtime would write them).
type auditLog struct {
	mu   sync.Mutex
	recs []map[string]any
	raw  bytes.Buffer
}

func (a *auditLog) fn(event string, fields map[string]any) {
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

// find returns the records of event.
func (a *auditLog) find(event string) []map[string]any {
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

func (a *auditLog) bytes() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]byte(nil), a.raw.Bytes()...)
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b.Bytes()...)
}

func testLogger(w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "test", Output: w, Level: hclog.Trace})
}

// assertNoSecret fails when secret occurs in any blob or in any file under
// dirs.
func assertNoSecret(t *testing.T, secret string, blobs map[string][]byte, dirs ...string) {
	t.Helper()
	for name, b := range blobs {
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("secret found in %s", name)
		}
	}
	scanned := 0
	for _, d := range dirs {
		_ = filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			scanned++
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("secret found in file %s", p)
			}
			return nil
		})
	}
	t.Logf("secret scan: %d blobs, %d files: clean unless reported", len(blobs), scanned)
}
