package integration

// The git smart-HTTP server the tests push to and fetch from is the test
// kit's (testutil.StartGitServer); its repository lives in a credDir.

import (
	"testing"

	"github.com/shimdev/shim/internal/testutil"
)

type (
	gitAccount    = testutil.GitAccount
	gitServerOpts = testutil.GitServerOptions
	gitServer     = testutil.GitServer
)

// startGitServer creates the bare repository with the seed commit in a new
// credDir and serves it until the test ends.
func startGitServer(t testing.TB, o gitServerOpts) *gitServer {
	t.Helper()
	if o.Root == "" {
		o.Root = credDir(t, -1)
	}
	return testutil.StartGitServer(t, o)
}
