package creds

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shimdev/shim/internal/testutil"
)

func runGit(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// gitBaseEnv isolates git from the machine's configuration.
func gitBaseEnv(home string) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + home, "GIT_CONFIG_NOSYSTEM=1",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid",
		"LC_ALL=C",
	}
}

// harnessEnv is what the runtime would give generation gen's harness: the
// test binary stands in for the shim binary as credential helper, and
// SHIM_TEST_GEN lets the test's Identify recognise the helper's pid.
func harnessEnv(t testing.TB, home, sock string, gen uint64, extra ...string) []string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := append(gitBaseEnv(home), envTestMode+"=helper", "SHIM_TEST_GEN="+strconv.FormatUint(gen, 10))
	env = append(env, extra...)
	return append(env, HarnessEnv(exe, sock)...)
}

// identifyByEnviron maps a pid to the generation named by SHIM_TEST_GEN in
// its environment (a stand-in for the runtime's cgroup lookup); current is
// the generation *current holds.
func identifyByEnviron(current *atomic.Uint64) Identify {
	return func(pid int) (uint64, bool, error) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			return 0, false, err
		}
		for _, kv := range bytes.Split(b, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte("SHIM_TEST_GEN=")); ok {
				g, err := strconv.ParseUint(string(v), 10, 64)
				return g, err == nil && g == current.Load(), err
			}
		}
		return 0, false, errors.New("not in a generation")
	}
}

func gitTry(dir string, env []string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestGitThroughBroker: real git, real smart-HTTP server with basic auth.
// The current generation's git authenticates through HarnessEnv +
// `credential get` (HelperMain) + the broker and can ls-remote and push;
// once generation 2 is current, generation 1's git cannot authenticate; after
// Revoke the generation's git cannot authenticate; the secret is nowhere in
// the files, logs, audit records or git output.
func TestGitThroughBroker(t *testing.T) {
	const user = "x-access-token"
	srv := testutil.StartGitServer(t, testutil.GitServerOptions{Accounts: map[string]testutil.GitAccount{user: {Password: testSecret}}})
	var current atomic.Uint64
	current.Store(1)
	audit := &auditLog{}
	logs := &syncBuffer{}
	sockDir := t.TempDir()
	sock := filepath.Join(sockDir, "cred.sock")
	b, err := NewBroker(sock, identifyByEnviron(&current), audit.Record, testLogger(logs))
	if err != nil {
		t.Fatal(err)
	}
	go b.Serve()
	t.Cleanup(func() { b.Close() })
	hostport := srv.HostPort
	b.Grant(1, []Credential{{Protocol: "http", Host: hostport, Path: "repo.git", Username: user, Password: testSecret}})
	b.Grant(2, []Credential{{Protocol: "http", Host: hostport, Username: user, Password: testSecret}})

	repoURL := srv.URL
	home1, home2 := t.TempDir(), t.TempDir()
	env1 := harnessEnv(t, home1, sock, 1)
	env2 := harnessEnv(t, home2, sock, 2)
	var outputs bytes.Buffer

	// Generation 1 is current: ls-remote and push work.
	out := runGit(t, home1, env1, "ls-remote", repoURL)
	outputs.WriteString(out)
	if !strings.Contains(out, "refs/heads/main") {
		t.Fatalf("ls-remote output: %s", out)
	}
	work1 := filepath.Join(home1, "work")
	outputs.WriteString(runGit(t, home1, env1, "clone", "-q", repoURL, work1))
	if err := os.WriteFile(filepath.Join(work1, "gen1"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runGit(t, work1, env1, "add", "gen1")
	runGit(t, work1, env1, "commit", "-q", "-m", "gen1")
	outputs.WriteString(runGit(t, work1, env1, "push", "-q", "origin", "main"))

	// Generation 2 becomes current (the runtime's view): generation 1's
	// git is refused even before its grant is revoked.
	current.Store(2)
	if err := os.WriteFile(filepath.Join(work1, "late"), []byte("late\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runGit(t, work1, env1, "add", "late")
	runGit(t, work1, env1, "commit", "-q", "-m", "late push from an abandoned generation")
	out, err = gitTry(work1, env1, "push", "origin", "main")
	outputs.WriteString(out)
	if err == nil {
		t.Fatalf("generation 1 pushed after generation 2 became current:\n%s", out)
	}
	refused := audit.Find(EventCredentialRefused)
	if len(refused) == 0 || refused[len(refused)-1]["reason"] != "not_current_generation" || refused[len(refused)-1]["generation"] != float64(1) {
		t.Errorf("refusal audit: %v", refused)
	}
	if n := b.Revoke(1); n != 1 {
		t.Errorf("Revoke(1) = %d", n)
	}

	// Generation 2 pushes.
	work2 := filepath.Join(home2, "work")
	outputs.WriteString(runGit(t, home2, env2, "clone", "-q", repoURL, work2))
	if err := os.WriteFile(filepath.Join(work2, "gen2"), []byte("2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runGit(t, work2, env2, "add", "gen2")
	runGit(t, work2, env2, "commit", "-q", "-m", "gen2")
	outputs.WriteString(runGit(t, work2, env2, "push", "-q", "origin", "main"))
	head := runGit(t, srv.Root, gitBaseEnv(home2), "--git-dir", srv.Bare, "log", "--format=%s", "main")
	if head != "gen2\ngen1\nseed\n" {
		t.Errorf("server history:\n%s", head)
	}

	// Revoke generation 2: its git can no longer authenticate.
	b.Revoke(2)
	out, err = gitTry(home2, env2, "ls-remote", repoURL)
	outputs.WriteString(out)
	if err == nil {
		t.Fatalf("ls-remote succeeded after Revoke:\n%s", out)
	}
	if !strings.Contains(out, "terminal prompts disabled") && !strings.Contains(out, "Authentication failed") {
		t.Errorf("unexpected failure: %s", out)
	}
	// A process outside any generation (this test process) gets nothing.
	if _, code := (&brokerFixture{sock: sock}).get(t, "protocol=http\nhost="+hostport+"\n\n"); code != 0 {
		t.Errorf("outside process: helper exit %d", code)
	}
	if r := audit.Find(EventCredentialRefused); r[len(r)-1]["reason"] != "not_a_generation" {
		t.Errorf("outside process: reason %v", r[len(r)-1]["reason"])
	}
	granted := audit.Find(EventCredentialGranted)
	if len(granted) == 0 {
		t.Error("no credential_granted audit records")
	}
	t.Logf("server requests: %d, granted %d, refused %d", len(srv.Requests()), len(granted), len(audit.Find(EventCredentialRefused)))
	assertNoSecret(t, testSecret, map[string][]byte{"audit": audit.Bytes(), "logs": logs.Bytes(), "git output": outputs.Bytes()},
		home1, home2, sockDir, srv.Root)
}
