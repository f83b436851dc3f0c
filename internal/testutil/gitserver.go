package testutil

// The git smart-HTTP server tests push to and fetch from: git http-backend
// behind net/http/cgi, basic auth checked before the backend runs, a bare
// repository with one seed commit on main and a request log in memory.

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// GitAccount is one user of the test git server. Branch, if set, is the
// branch whose tip is recorded after each of the user's successful pushes.
type GitAccount struct {
	Password string
	Branch   string
}

// GitServerOptions configures StartGitServer.
type GitServerOptions struct {
	Addr      string                // listen address; "" is 127.0.0.1:0
	Accounts  map[string]GitAccount // user -> account
	AnonFetch bool                  // fetches need no auth (pushes always do)
	Seed      map[string]string     // files of the seed commit; nil is README
	Root      string                // GIT_PROJECT_ROOT, an existing directory; "" is a t.TempDir()
	NoRepo    bool                  // serve the bare repositories already under Root: create no repo.git
}

// GitRequest is one request the git server saw. At is when the request's
// first bytes were read (http.StateActive), before auth was checked.
type GitRequest struct {
	At     time.Time
	Method string
	Path   string // path and query
	User   string // as sent, whether or not the password matched
	Authed bool   // the user is an account and the password matched
	Status int
	Tip    string // receive-pack POST that succeeded: the user's branch tip after it
}

// ReceivePack reports whether r is a push (a receive-pack POST).
func (r GitRequest) ReceivePack() bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/git-receive-pack")
}

// GitServer serves the bare repositories under Root, by default the one
// StartGitServer creates, repo.git.
type GitServer struct {
	Base     string // http://host:port
	URL      string // Base + "/repo.git" ("" with NoRepo)
	HostPort string
	Root     string // GIT_PROJECT_ROOT
	Bare     string // Root/repo.git ("" with NoRepo)
	Seed     string // the seed commit on main ("" with NoRepo)

	mu     sync.Mutex
	reqs   []GitRequest
	active map[net.Conn]time.Time
}

// Requests returns every request so far, in the order they were answered.
func (s *GitServer) Requests() []GitRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]GitRequest(nil), s.reqs...)
}

// OpenConns is the number of connections open now.
func (s *GitServer) OpenConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.active)
}

// Pushes returns the successful receive-pack POSTs of user.
func (s *GitServer) Pushes(user string) []GitRequest {
	return s.PushesSince(user, time.Time{})
}

// PushesSince returns the successful receive-pack POSTs of user after since.
func (s *GitServer) PushesSince(user string, since time.Time) []GitRequest {
	var out []GitRequest
	for _, r := range s.Requests() {
		if r.User == user && r.ReceivePack() && r.Status == http.StatusOK && r.At.After(since) {
			out = append(out, r)
		}
	}
	return out
}

// Settled reports whether every connection opened before t is closed: a
// request that began before t (a push whose body had reached the server
// before a fence) has been carried out or refused by now.
func (s *GitServer) Settled(t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range s.active {
		if at.Before(t) {
			return false
		}
	}
	return true
}

// Ref returns the commit a ref points to in the bare repository, "" if none.
func (s *GitServer) Ref(name string) string {
	out, err := exec.Command("git", "--git-dir", s.Bare, "rev-parse", "-q", "--verify", name).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// Git runs git in the bare repository (in the test process) and returns
// its trimmed output; it fails the test on error.
func (s *GitServer) Git(t testing.TB, args ...string) string {
	t.Helper()
	return gitRun(t, s.Bare, gitSeedEnv(s.Root), args...)
}

// gitSeedEnv isolates the server's own git from the machine's configuration.
func gitSeedEnv(home string) []string {
	return []string{
		"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "GIT_CONFIG_NOSYSTEM=1", "LC_ALL=C",
		"GIT_AUTHOR_NAME=seed", "GIT_AUTHOR_EMAIL=seed@example.invalid",
		"GIT_COMMITTER_NAME=seed", "GIT_COMMITTER_EMAIL=seed@example.invalid",
	}
}

func gitRun(t testing.TB, dir string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// gitStatusWriter keeps the status the CGI handler answered with.
type gitStatusWriter struct {
	http.ResponseWriter
	code int
}

func (w *gitStatusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *gitStatusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *gitStatusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

type gitConnKey struct{}

// StartGitServer creates the bare repository Root/repo.git with the seed
// commit (unless o.NoRepo) and serves Root until the test ends. Without git
// or git-http-backend the test is skipped, or fails under Strict.
func StartGitServer(t testing.TB, o GitServerOptions) *GitServer {
	t.Helper()
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.Seed == nil {
		o.Seed = map[string]string{"README": "seed\n"}
	}
	if o.Root == "" {
		o.Root = t.TempDir()
	}
	NeedTool(t, "git")
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend")
	_, err = os.Stat(backend)
	Need(t, err == nil, "git-http-backend not found (scripts/deps installs git)")
	s := &GitServer{Root: o.Root, active: map[net.Conn]time.Time{}}
	if !o.NoRepo {
		s.seed(t, o.Seed)
	}
	cgiH := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + o.Root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + o.Root}}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:     http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, o, cgiH) }),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, gitConnKey{}, c) },
		ConnState: func(c net.Conn, st http.ConnState) {
			now := time.Now()
			s.mu.Lock()
			defer s.mu.Unlock()
			switch st {
			case http.StateActive:
				s.active[c] = now
			case http.StateClosed, http.StateHijacked:
				delete(s.active, c)
			}
		},
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s.HostPort = ln.Addr().String()
	s.Base = "http://" + s.HostPort
	if !o.NoRepo {
		s.URL = s.Base + "/repo.git"
	}
	return s
}

// seed makes the bare repo.git, push enabled, with one commit of files.
func (s *GitServer) seed(t testing.TB, files map[string]string) {
	env := gitSeedEnv(s.Root)
	gitRun(t, s.Root, env, "init", "-q", "--bare", "-b", "main", "repo.git")
	s.Bare = filepath.Join(s.Root, "repo.git")
	s.Git(t, "config", "http.receivepack", "true")
	seed := filepath.Join(s.Root, "seed")
	gitRun(t, s.Root, env, "init", "-q", "-b", "main", seed)
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(seed, name), []byte(files[name]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitRun(t, seed, env, append([]string{"add", "--"}, names...)...)
	gitRun(t, seed, env, "commit", "-q", "-m", "seed")
	gitRun(t, seed, env, "push", "-q", s.Bare, "main")
	s.Seed = gitRun(t, seed, env, "rev-parse", "HEAD")
}

// serve answers one smart-HTTP request through git-http-backend, with
// basic auth for pushes (and fetches unless AnonFetch), and records it.
func (s *GitServer) serve(w http.ResponseWriter, r *http.Request, o GitServerOptions, cgiH *cgi.Handler) {
	s.mu.Lock()
	at, ok := s.active[r.Context().Value(gitConnKey{}).(net.Conn)]
	s.mu.Unlock()
	if !ok {
		at = time.Now()
	}
	rec := GitRequest{At: at, Method: r.Method, Path: r.URL.RequestURI()}
	user, pass, hasAuth := r.BasicAuth()
	rec.User = user
	acct, known := o.Accounts[user]
	rec.Authed = hasAuth && known && pass == acct.Password
	push := strings.HasSuffix(r.URL.Path, "/git-receive-pack") || r.URL.Query().Get("service") == "git-receive-pack"
	switch {
	case !rec.Authed && (push || !o.AnonFetch):
		w.Header().Set("WWW-Authenticate", `Basic realm="shim-test"`)
		http.Error(w, "authentication required", http.StatusUnauthorized)
		rec.Status = http.StatusUnauthorized
	case !whole(r):
		http.Error(w, "the request body ended before its Content-Length", http.StatusBadRequest)
		rec.Status = http.StatusBadRequest
	default:
		r.Header.Del("Authorization") // the backend does not need it
		sw := &gitStatusWriter{ResponseWriter: w}
		cgiH.ServeHTTP(sw, r)
		rec.Status = sw.code
		if rec.Status == 0 {
			rec.Status = http.StatusOK
		}
		if rec.Authed && acct.Branch != "" && s.Bare != "" && rec.ReceivePack() && rec.Status == http.StatusOK {
			rec.Tip = s.Ref("refs/heads/" + acct.Branch)
		}
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, rec)
	s.mu.Unlock()
}

// maxWholeBody bounds the request bodies the server reads whole before
// the backend sees them (whole).
const maxWholeBody = 256 << 20

// whole reads r's body whole when it has a Content-Length (up to
// maxWholeBody) and reports whether it had all of it. git http-backend
// (2.39) copies such a body to receive-pack and, when it ends early (a
// pusher killed by a fence, the attack tests' business), reads EOF in a
// loop for ever: it spun a CPU until the test binary's timeout, and the
// server's Close waited on it.
func whole(r *http.Request) bool {
	if r.ContentLength <= 0 || r.ContentLength > maxWholeBody {
		return true
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, r.ContentLength))
	if err != nil || int64(len(b)) != r.ContentLength {
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return true
}
