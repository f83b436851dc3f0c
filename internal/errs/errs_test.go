package errs

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

func TestOneFormatAndTheCodeAnywhereInAChain(t *testing.T) {
	e := Wrap("RESTORE_FAILED", fs.ErrNotExist, "restore %s", "/w")
	if e.Error() != "restore /w: file does not exist" || e.Code() != "RESTORE_FAILED" {
		t.Fatalf("%q %q", e.Error(), e.Code())
	}
	outer := fmt.Errorf("fence: %w", e)
	if CodeOf(outer) != "RESTORE_FAILED" || !errors.Is(outer, fs.ErrNotExist) {
		t.Fatal("code or cause lost through wrapping")
	}
	if CodeOf(errors.New("plain")) != "" || New("X", "m").Error() != "m" {
		t.Fatal("plain errors have no code; New has no cause")
	}
}
