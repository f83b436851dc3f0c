package integration

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// The binary's own verbs, as a person meets them.

func TestCLIInitAsNonRootSaysRoot(t *testing.T) {
	requireRoot(t) // to become someone else
	cmd := exec.Command(shimBin, "init", "--runtime-dir", filepath.Join(t.TempDir(), "rd"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: wtUID, Gid: wtUID, Groups: []uint32{}}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	msg := strings.TrimSpace(stderr.String())
	if !ok || ee.ExitCode() != 1 || !strings.Contains(msg, "must run as root") || len(msg) > 300 || strings.Count(msg, "\n") > 0 {
		t.Errorf("shim init as uid %d: %v, stderr (%d bytes) %q", wtUID, err, len(msg), msg)
	}
}
