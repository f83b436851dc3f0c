package integration

import (
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

// A supervisor's mistakes, through shim ctl and the API: none of them
// bricks the sandbox, and the same request gets the same code whatever
// runs.

// A start without --user (the harness runs as root) on layers used to
// dereference the missing user while checking --lower-group: a panic,
// INTERNAL, after the token had moved.
func TestMistakeNoUserOnLayersStarts(t *testing.T) {
	s := startShim(t, shimOpts{args: []string{"--isolation", "auto"}})
	var r api.StartResult
	s.MustCtl(&r, "start", "--generation", "1", "--", "sleep", "1000")
	_, errs, code := s.Ctl("start", "--generation", "2", "--user", "0:65533", "--", "true")
	if e := ctlError(t, errs); code != 2 || e.Code != api.CodeBadRequest || !strings.Contains(e.Message, "--lower-group") {
		t.Errorf("the lower group as a harness's: exit %d %+v", code, e)
	}
}
