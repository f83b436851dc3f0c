package creds

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// TestIsolatedGitPush puts the pieces together the way the runtime will:
// generation 21 runs git inside its isolated namespace (forked from Run)
// with HarnessEnv + Network.Env; git reaches the smart-HTTP server in shim's
// namespace only through the proxy and authenticates through the broker.
// After Cut, a push fails to connect even though the credential is still
// granted, and the server sees no request from it.
func TestIsolatedGitPush(t *testing.T) {
	requireNetns(t)
	const user = "bot"
	// 127.0.0.2 so NO_PROXY (127.0.0.1, localhost) does not apply.
	srv := startGitServer(t, "127.0.0.2:0", user, testSecret)
	hostport := strings.TrimPrefix(srv.URL, "http://")
	var current atomic.Uint64
	current.Store(21)
	audit, logs := &auditLog{}, &syncBuffer{}
	sockDir := t.TempDir()
	b, err := NewBroker(filepath.Join(sockDir, "cred.sock"), identifyByEnviron(&current), audit.fn, testLogger(logs))
	if err != nil {
		t.Fatal(err)
	}
	go b.Serve()
	t.Cleanup(func() { b.Close() })
	b.Grant(21, []Credential{{Protocol: "http", Host: hostport, Username: user, Password: testSecret}})

	n, err := NewNetwork(21, NetworkConfig{Mode: ModeIsolated, Allow: []string{hostport}, Audit: audit.fn, Log: testLogger(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	home := t.TempDir()
	env := harnessEnv(t, home, b.Path(), 21, n.Env()...)
	git := func(dir string, args ...string) (string, error) {
		var out []byte
		err := n.Run(func() error {
			cmd := exec.Command("git", args...)
			cmd.Dir, cmd.Env = dir, env
			var err error
			out, err = cmd.CombinedOutput()
			return err
		})
		return string(out), err
	}
	work := filepath.Join(home, "work")
	if out, err := git(home, "clone", "-q", srv.URL+"/repo.git", work); err != nil {
		t.Fatalf("clone through proxy: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(work, "f"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runGit(t, work, env, "add", "f")
	runGit(t, work, env, "commit", "-q", "-m", "isolated")
	if out, err := git(work, "push", "-q", "origin", "main"); err != nil {
		t.Fatalf("push through proxy: %v\n%s", err, out)
	}
	if len(audit.find(EventConnectionOpened)) == 0 || len(audit.find(EventCredentialGranted)) == 0 {
		t.Error("missing connection or credential audit records")
	}

	rep, err := n.Cut()
	if err != nil || !rep.LinkDeleted {
		t.Fatalf("Cut: %+v %v", rep, err)
	}
	seen := len(srv.requests())
	runGit(t, work, env, "commit", "-q", "--allow-empty", "-m", "after cut")
	out, err := git(work, "push", "-q", "origin", "main")
	if err == nil {
		t.Fatalf("push after Cut succeeded:\n%s", out)
	}
	if got := len(srv.requests()); got != seen {
		t.Errorf("server saw %d requests after Cut", got-seen)
	}
	assertNoSecret(t, testSecret, map[string][]byte{"audit": audit.bytes(), "logs": logs.Bytes(), "git": []byte(out)}, home, sockDir, srv.root)
}
