package gitguard

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shimdev/shim/internal/testutil"
)

// netRecorder runs git like ExecRunner and records which invocations asked
// for the network (subs, args, envs), and the argv and environment of
// every git it ran (allArgs, allEnvs).
type netRecorder struct {
	mu               sync.Mutex
	subs             []string
	args, envs       [][]string
	allArgs, allEnvs [][]string
}

func (r *netRecorder) Run(ctx context.Context, cmd *exec.Cmd) error {
	r.record(cmd, false)
	return ExecRunner{}.Run(ctx, cmd)
}

func (r *netRecorder) RunWithNetwork(ctx context.Context, cmd *exec.Cmd) error {
	r.record(cmd, true)
	return ExecRunner{}.Run(ctx, cmd)
}

func (r *netRecorder) record(cmd *exec.Cmd, network bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	args, env := append([]string(nil), cmd.Args...), append([]string(nil), cmd.Env...)
	r.allArgs, r.allEnvs = append(r.allArgs, args), append(r.allEnvs, env)
	if network {
		r.subs = append(r.subs, subcommand(cmd.Args))
		r.args, r.envs = append(r.args, args), append(r.envs, env)
	}
}

// leaks returns every argv word and environment entry of the recorded
// gits that contains one of the secrets.
func (r *netRecorder) leaks(secrets ...string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var found []string
	for _, list := range [][][]string{r.allArgs, r.allEnvs} {
		for _, words := range list {
			for _, w := range words {
				for _, sec := range secrets {
					if strings.Contains(w, sec) {
						found = append(found, w)
					}
				}
			}
		}
	}
	return found
}

// testCred is a credential the test's FetchAuth knows.
type testCred struct{ protocol, host, path, user, pass string }

// storeAuth is a FetchAuth whose helper is `git credential-store` on a 0600
// file in a temporary directory holding c (test only: shim's helper asks
// the broker): the secret reaches git through the helper's stdout only.
// Has matches like the broker: protocol and host exactly, path by prefix
// (credential-store itself wants the exact path: c.path is the repository's).
func storeAuth(t *testing.T, c testCred, env ...string) *FetchAuth {
	t.Helper()
	file := filepath.Join(t.TempDir(), "credentials")
	u := url.URL{Scheme: c.protocol, User: url.UserPassword(c.user, c.pass), Host: c.host, Path: "/" + c.path}
	must(t, os.WriteFile(file, []byte(u.String()+"\n"), 0o600))
	return &FetchAuth{
		Has: func(protocol, host, path, username string) bool {
			return protocol == c.protocol && host == c.host && (username == "" || username == c.user) &&
				(path == c.path || strings.HasPrefix(path, c.path+"/"))
		},
		Helper: "store --file " + file,
		Env:    env,
	}
}

// fetchFixture is a fixture whose origin is a file:// URL in the registered
// config.
func fetchFixture(t *testing.T) (*fixture, *Guard, *netRecorder) {
	f := newFixture(t)
	tgit(t, f.wt, "remote", "set-url", "origin", "file://"+f.origin)
	tgit(t, f.wt, "fetch", "-q", "origin")
	rec := &netRecorder{}
	g := f.guard(t, func(c *Config) { c.Runner = rec })
	return f, g, rec
}

// TestFetchReportsPushesOfTheAbandonedGeneration: the abandoned generation
// commits and pushes to the remote, then points its .git/config at another
// repository; the restore's fetch uses the registered URL, lands the branch
// under refs/shim/remote/origin/main without touching refs/remotes, and
// reports remote_moved with the pushed commit.
func TestFetchReportsPushesOfTheAbandonedGeneration(t *testing.T) {
	ctx := context.Background()
	f, g, rec := fetchFixture(t)

	// The abandoned generation: a pushed commit, a local edit, and a
	// redirected remote.
	writeFile(t, filepath.Join(f.wt, "src/main.go"), "package main // pushed\n")
	tgit(t, f.wt, "commit", "-q", "-am", "harness: pushed change")
	pushed := tgit(t, f.wt, "rev-parse", "HEAD")
	tgit(t, f.wt, "push", "-q", "origin", "HEAD:main")
	writeFile(t, filepath.Join(f.wt, "README.md"), "unsaved edit\n")
	decoy := filepath.Join(f.root, "decoy.git")
	tgit(t, f.root, "clone", "-q", "--bare", f.origin, decoy)
	tgit(t, f.wt, "remote", "set-url", "origin", "file://"+decoy)
	tracking := tgit(t, f.wt, "rev-parse", "refs/remotes/origin/main")
	must(t, os.Remove(filepath.Join(f.wt, ".git", "FETCH_HEAD")))

	rep, err := g.Restore(ctx, 1, f.baseline, WithFetch(FetchSpec{}))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	fr := rep.Fetch
	if fr == nil {
		t.Fatal("no fetch report")
	}
	b, _ := json.MarshalIndent(fr, "", "  ")
	t.Logf("fetch report: %s", b)
	if fr.Error != "" {
		t.Fatalf("fetch error: %s", fr.Error)
	}
	if fr.Remote != "origin" || fr.Branch != "main" || fr.URL != "file://"+f.origin || fr.Ref != "refs/shim/remote/origin/main" {
		t.Errorf("remote/branch/url/ref = %q %q %q %q", fr.Remote, fr.Branch, fr.URL, fr.Ref)
	}
	if fr.FetchedCommit != pushed || fr.Baseline != f.baseline {
		t.Errorf("fetched %s (want %s), baseline %s", fr.FetchedCommit, pushed, fr.Baseline)
	}
	if !fr.RemoteMoved || fr.RemoteCommitCount != 1 || len(fr.RemoteCommits) != 1 ||
		fr.RemoteCommits[0] != (RemoteCommit{Commit: pushed, Subject: "harness: pushed change"}) {
		t.Errorf("remote_moved %v, count %d, commits %+v", fr.RemoteMoved, fr.RemoteCommitCount, fr.RemoteCommits)
	}
	if fr.Authenticated {
		t.Error("authenticated without credentials")
	}
	if got := tgit(t, f.wt, "rev-parse", "refs/shim/remote/origin/main"); got != pushed {
		t.Errorf("refs/shim/remote/origin/main = %s, want %s", got, pushed)
	}
	// The harness's push moved its remote-tracking ref; the trusted value
	// is back and the harness's is kept. The fetch wrote neither.
	if got := tgit(t, f.wt, "rev-parse", "refs/remotes/origin/main"); got != f.baseline {
		t.Errorf("refs/remotes/origin/main = %s, want the trusted %s", got, f.baseline)
	}
	if got := tgit(t, f.wt, "rev-parse", HarnessRefPrefix+"1/refs/remotes/origin/main"); got != tracking {
		t.Errorf("the harness's refs/remotes/origin/main is kept as %s, want %s", got, tracking)
	}
	if _, err := os.Stat(filepath.Join(f.wt, ".git", "FETCH_HEAD")); err == nil {
		t.Error("FETCH_HEAD written")
	}
	// The restore itself is unchanged: worktree at the baseline, the edit saved.
	if got := tgit(t, f.wt, "rev-parse", "HEAD"); got != f.baseline {
		t.Errorf("HEAD %s, want the baseline", got)
	}
	if got := tgit(t, f.wt, "show", rep.SnapshotRef+":README.md"); got != "unsaved edit" {
		t.Errorf("snapshot README = %q", got)
	}
	if _, ok := rep.DurationsMS["fetch"]; !ok {
		t.Error("no fetch duration")
	}
	// Only the fetch had the network.
	if len(rec.subs) != 1 || rec.subs[0] != "fetch" {
		t.Errorf("git with network: %v, want only fetch", rec.subs)
	}
	// The remote was not rewritten.
	if got := tgit(t, f.origin, "rev-parse", "refs/heads/main"); got != pushed {
		t.Errorf("origin main = %s", got)
	}

	// A remote that did not move past the baseline: false, no commits.
	rep, err = g.Restore(ctx, 2, pushed, WithFetch(FetchSpec{Remote: "origin", Branch: "main"}))
	if err != nil {
		t.Fatalf("restore 2: %v", err)
	}
	if fr := rep.Fetch; fr.Error != "" || fr.RemoteMoved || fr.RemoteCommitCount != 0 || len(fr.RemoteCommits) != 0 || fr.FetchedCommit != pushed {
		t.Errorf("no-op remote: %+v", fr)
	}
	// A baseline ahead of the remote (local commits not pushed): the remote
	// is an ancestor, so it did not move.
	writeFile(t, filepath.Join(f.wt, "new.txt"), "ahead\n")
	tgit(t, f.wt, "add", "new.txt")
	tgit(t, f.wt, "commit", "-q", "-m", "ahead")
	ahead := tgit(t, f.wt, "rev-parse", "HEAD")
	rep, err = g.Restore(ctx, 3, ahead, WithFetch(FetchSpec{}))
	if err != nil {
		t.Fatalf("restore 3: %v", err)
	}
	if fr := rep.Fetch; fr.Error != "" || fr.RemoteMoved {
		t.Errorf("remote behind the baseline: %+v", fr)
	}
}

// TestFetchFailureDoesNotFailTheRestore: an unreachable remote, an unknown
// remote, a detached registered HEAD without a branch and an ssh URL are
// reported in fetch.error; the restore still succeeds.
func TestFetchFailureDoesNotFailTheRestore(t *testing.T) {
	ctx := context.Background()
	f, g, _ := fetchFixture(t)
	cases := []struct {
		name string
		spec FetchSpec
		want string
	}{
		{"unknown remote", FetchSpec{Remote: "nowhere"}, `remote "nowhere" has no url`},
		{"missing branch", FetchSpec{Branch: "no-such-branch"}, "fetch no-such-branch"},
	}
	for i, tc := range cases {
		writeFile(t, filepath.Join(f.wt, "README.md"), "edit "+tc.name+"\n")
		rep, err := g.Restore(ctx, uint64(i+1), f.baseline, WithFetch(tc.spec))
		if err != nil {
			t.Fatalf("%s: restore failed: %v", tc.name, err)
		}
		if rep.Fetch == nil || !strings.Contains(rep.Fetch.Error, tc.want) {
			t.Errorf("%s: fetch report %+v, want error containing %q", tc.name, rep.Fetch, tc.want)
		}
		if got := tgit(t, f.wt, "status", "--porcelain"); got != "" {
			t.Errorf("%s: worktree not clean: %s", tc.name, got)
		}
	}

	// Unsupported transports, from the registered config: a fresh
	// registration per URL.
	for _, u := range []string{"ssh://git@example.invalid/x.git", "git@example.invalid:x.git", "ext::sh -c evil", "git://example.invalid/x"} {
		f := newFixture(t)
		tgit(t, f.wt, "remote", "set-url", "origin", u)
		g := f.guard(t, nil)
		rep, err := g.Restore(ctx, 1, f.baseline, WithFetch(FetchSpec{}))
		if err != nil {
			t.Fatalf("%s: restore failed: %v", u, err)
		}
		if rep.Fetch == nil || rep.Fetch.Error == "" || rep.Fetch.FetchedCommit != "" {
			t.Errorf("%s: fetch report %+v, want a refusal", u, rep.Fetch)
		}
	}

	if err := (FetchSpec{Branch: "-evil"}).Validate(); code(err) != CodeBadRequest {
		t.Errorf("branch -evil: %v", err)
	}
	if err := (FetchSpec{Remote: "a/../b"}).Validate(); code(err) != CodeBadRequest {
		t.Errorf("remote a/../b: %v", err)
	}
	if _, err := g.Restore(ctx, 9, f.baseline, WithFetch(FetchSpec{Branch: "x y"})); code(err) != CodeBadRequest {
		t.Errorf("restore with branch 'x y': %v", err)
	}
}

// TestFetchSendsTheMatchingCredentialOnly: over http, the credential helper
// is given to the fetching git only when FetchAuth has a credential for the
// remote's protocol, host and path, and git then sends it as Basic auth to
// that URL; the secret is in no argv and no environment of any git shim
// ran, and not in the report even when the fetch fails.
func TestFetchSendsTheMatchingCredentialOnly(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var auths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auths = append(auths, r.Header.Get("Authorization"))
		mu.Unlock()
		// Echo the header back in the error body: git may print it.
		w.Header().Set("WWW-Authenticate", `Basic realm="t"`)
		http.Error(w, "denied "+r.Header.Get("Authorization"), http.StatusUnauthorized)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	const secret = "s3cr3t-token-value"
	basic := base64.StdEncoding.EncodeToString([]byte("bot:" + secret))
	for _, tc := range []struct {
		name     string
		cred     testCred
		wantSent bool
	}{
		{"matching", testCred{"http", host, "org/repo.git", "bot", secret}, true},
		{"other path", testCred{"http", host, "org/other.git", "bot", secret}, false},
		{"https only", testCred{"https", host, "org/repo.git", "bot", secret}, false},
	} {
		mu.Lock()
		auths = nil
		mu.Unlock()
		f := newFixture(t)
		tgit(t, f.wt, "remote", "set-url", "origin", srv.URL+"/org/repo.git")
		rec := &netRecorder{}
		g := f.guard(t, func(c *Config) { c.Runner = rec })
		auth := storeAuth(t, tc.cred, "SHIM_TEST_HELPER_ENV=1")
		rep, err := g.Restore(ctx, 1, f.baseline, WithFetch(FetchSpec{Auth: auth, Timeout: 20 * time.Second}))
		if err != nil {
			t.Fatalf("%s: restore: %v", tc.name, err)
		}
		fr := rep.Fetch
		if fr.Error == "" || fr.Authenticated != tc.wantSent {
			t.Errorf("%s: report %+v", tc.name, fr)
		}
		b, _ := json.Marshal(rep)
		if strings.Contains(string(b), secret) || strings.Contains(string(b), basic) {
			t.Errorf("%s: the report carries the secret: %s", tc.name, b)
		}
		mu.Lock()
		sent := false
		for _, a := range auths {
			if a == "Basic "+basic {
				sent = true
			} else if a != "" {
				t.Errorf("%s: unexpected Authorization %q", tc.name, a)
			}
		}
		n := len(auths)
		mu.Unlock()
		if n == 0 {
			t.Errorf("%s: the server saw no request", tc.name)
		}
		if sent != tc.wantSent {
			t.Errorf("%s: credential sent = %v, want %v", tc.name, sent, tc.wantSent)
		}
		if l := rec.leaks(secret, basic); len(l) > 0 {
			t.Errorf("%s: the secret is in a git's argv or environment: %q", tc.name, l)
		}
		helperGiven := false
		for _, e := range rec.envs {
			helperGiven = helperGiven || slices.Contains(e, "SHIM_TEST_HELPER_ENV=1")
		}
		if helperGiven != tc.wantSent {
			t.Errorf("%s: FetchAuth.Env in the fetching git's environment = %v, want %v", tc.name, helperGiven, tc.wantSent)
		}
	}
}

// TestFetchAuthenticatedSmartHTTP: a real smart-HTTP server (git
// http-backend) that requires basic auth serves the origin; the abandoned
// generation pushed to it. The fetch authenticates through the helper,
// lands the pushed commit and reports it, and no git shim ran had the
// password in its argv or environment.
func TestFetchAuthenticatedSmartHTTP(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	const user, secret = "bot", "smart-http-s3cr3t"
	srv := testutil.StartGitServer(t, testutil.GitServerOptions{Root: f.root, NoRepo: true,
		Accounts: map[string]testutil.GitAccount{user: {Password: secret}}})
	host := srv.HostPort
	writeFile(t, filepath.Join(f.wt, "src/main.go"), "package main // pushed\n")
	tgit(t, f.wt, "commit", "-q", "-am", "harness: pushed")
	pushed := tgit(t, f.wt, "rev-parse", "HEAD")
	tgit(t, f.wt, "push", "-q", "origin", "HEAD:main")
	tgit(t, f.wt, "reset", "-q", "--hard", f.baseline)
	tgit(t, f.wt, "remote", "set-url", "origin", srv.Base+"/origin.git")
	rec := &netRecorder{}
	g := f.guard(t, func(c *Config) { c.Runner = rec })

	// Without FetchAuth: refused by the server, reported, not fatal.
	rep, err := g.Restore(ctx, 1, f.baseline, WithFetch(FetchSpec{Timeout: 20 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Fetch.Error == "" || rep.Fetch.Authenticated {
		t.Errorf("anonymous fetch: %+v", rep.Fetch)
	}

	auth := storeAuth(t, testCred{"http", host, "origin.git", user, secret})
	rep, err = g.Restore(ctx, 2, f.baseline, WithFetch(FetchSpec{Auth: auth, Timeout: 20 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	fr := rep.Fetch
	if fr.Error != "" || !fr.Authenticated || fr.FetchedCommit != pushed || !fr.RemoteMoved || fr.RemoteCommitCount != 1 {
		t.Fatalf("authenticated fetch: %+v (requests %+v)", fr, srv.Requests())
	}
	if l := rec.leaks(secret, base64.StdEncoding.EncodeToString([]byte(user+":"+secret))); len(l) > 0 {
		t.Errorf("the secret is in a git's argv or environment: %q", l)
	}
	if b, _ := json.Marshal(rep); strings.Contains(string(b), secret) {
		t.Errorf("the report carries the secret: %s", b)
	}
	authed := false
	for _, r := range srv.Requests() {
		authed = authed || r.User == user && r.Authed
	}
	if !authed {
		t.Errorf("the server saw no authenticated request: %+v", srv.Requests())
	}
}

// TestFetchStandaloneUsesThePristineConfig: Fetch outside a Restore puts the
// registered config back first, so a remote URL the harness rewrote is not
// used, and it resets nothing in the worktree.
func TestFetchStandaloneUsesThePristineConfig(t *testing.T) {
	ctx := context.Background()
	f, g, _ := fetchFixture(t)
	seed := filepath.Join(f.root, "seed")
	tgit(t, f.root, "clone", "-q", f.origin, seed)
	writeFile(t, filepath.Join(seed, "pushed.txt"), "x\n")
	tgit(t, seed, "add", "pushed.txt")
	tgit(t, seed, "commit", "-q", "-m", "pushed elsewhere")
	tgit(t, seed, "push", "-q", "origin", "HEAD:main")
	pushed := tgit(t, seed, "rev-parse", "HEAD")
	tgit(t, f.wt, "remote", "set-url", "origin", "file:///nonexistent/decoy.git")
	writeFile(t, filepath.Join(f.wt, "README.md"), "kept edit\n")

	fr, err := g.Fetch(ctx, f.baseline, FetchSpec{})
	if err != nil {
		t.Fatal(err)
	}
	if fr.Error != "" || fr.URL != "file://"+f.origin || !fr.RemoteMoved || fr.FetchedCommit != pushed {
		t.Errorf("fetch report %+v", fr)
	}
	if got := readFileT(t, filepath.Join(f.wt, "README.md")); got != "kept edit\n" {
		t.Errorf("Fetch touched the worktree: README = %q", got)
	}
	if _, err := g.Fetch(ctx, "no-such-rev", FetchSpec{}); code(err) != CodeBadRequest {
		t.Errorf("unknown baseline: %v", err)
	}
}

func readFileT(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	return string(b)
}

// TestFetchScrubsSecrets: a password embedded in the registered URL, and
// anything that looks like an Authorization value a server echoes, never
// reach the report.
func TestFetchScrubsSecrets(t *testing.T) {
	const pw = "pw-in-the-url-42"
	got := scrubSecrets("fatal: http://bot:"+pw+"@h/x denied Basic Ym90OnMzY3IzdA== and\nAuthorization: Bearer abc.def\nok", []string{pw})
	if strings.Contains(got, pw) || strings.Contains(got, "Ym90OnMzY3IzdA") || strings.Contains(got, "abc.def") || !strings.HasSuffix(got, "\nok") {
		t.Errorf("scrubbed: %q", got)
	}

	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, _ := r.BasicAuth()
		http.Error(w, "nope "+u+":"+p+" "+r.URL.String(), http.StatusForbidden)
	}))
	defer srv.Close()
	f := newFixture(t)
	tgit(t, f.wt, "remote", "set-url", "origin", strings.Replace(srv.URL, "http://", "http://bot:"+pw+"@", 1)+"/x.git")
	rec := &netRecorder{}
	g := f.guard(t, func(c *Config) { c.Runner = rec })
	rep, err := g.Restore(ctx, 1, f.baseline, WithFetch(FetchSpec{Timeout: 20 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Fetch.Error == "" || rep.Fetch.Authenticated {
		t.Errorf("fetch %+v", rep.Fetch)
	}
	if b, _ := json.Marshal(rep); strings.Contains(string(b), pw) {
		t.Errorf("the report carries the URL's password: %s", b)
	}
}
