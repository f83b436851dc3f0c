package creds

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
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

// The audit recorder, log sink and logger of the test kit.
type auditLog = testutil.AuditLog
type syncBuffer = testutil.SyncBuffer

func testLogger(w io.Writer) hclog.Logger { return testutil.Logger(w) }

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
