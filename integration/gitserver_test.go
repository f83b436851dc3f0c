package integration

// The git smart-HTTP server the tests push to and fetch from: git
// http-backend behind net/http/cgi, basic auth, a bare repository with one
// seed commit on main and a request log in memory.

import (
	"context"
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

// gitAccount is one user of the test git server. branch, if set, is the
// branch whose tip is recorded after each of the user's successful pushes.
type gitAccount struct {
	password string
	branch   string
}

// gitServerOpts configures startGitServer.
type gitServerOpts struct {
	addr      string                // listen address; "" is 127.0.0.1:0
	accounts  map[string]gitAccount // user -> account
	anonFetch bool                  // fetches need no auth (pushes always do)
	seed      map[string]string     // files of the seed commit; nil is README
}

// gitReq is one request the git server saw. At is when the request's first
// bytes were read (http.StateActive), before auth was checked.
type gitReq struct {
	At     time.Time
	Method string
	Path   string // path and query
	User   string // as sent, whether or not the password matched
	Status int
	Tip    string // receive-pack POST that succeeded: the user's branch tip after it
}

func (r gitReq) receivePack() bool {
	return r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/git-receive-pack")
}

// gitServer serves the bare repository repo.git.
type gitServer struct {
	URL      string // http://host:port/repo.git
	HostPort string
	Bare     string
	Seed     string // the seed commit on main

	mu     sync.Mutex
	reqs   []gitReq
	active map[net.Conn]time.Time
}

func (s *gitServer) requests() []gitReq {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]gitReq(nil), s.reqs...)
}

// pushes returns the successful receive-pack POSTs of user.
func (s *gitServer) pushes(user string) []gitReq {
	return s.pushesSince(user, time.Time{})
}

// pushesSince returns the successful receive-pack POSTs of user after since.
func (s *gitServer) pushesSince(user string, since time.Time) []gitReq {
	var out []gitReq
	for _, r := range s.requests() {
		if r.User == user && r.receivePack() && r.Status == http.StatusOK && r.At.After(since) {
			out = append(out, r)
		}
	}
	return out
}

// ref returns the commit a ref points to in the bare repository, "" if none.
func (s *gitServer) ref(name string) string {
	out, err := exec.Command("git", "--git-dir", s.Bare, "rev-parse", "-q", "--verify", name).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// git runs git in the bare repository (as root, in the test process).
func (s *gitServer) git(t testing.TB, args ...string) string {
	t.Helper()
	return gitRun(t, s.Bare, gitEnv(filepath.Dir(s.Bare)), args...)
}

func gitEnv(home string) []string {
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

// startGitServer creates the bare repository with the seed commit and serves
// it until the test ends.
func startGitServer(t testing.TB, o gitServerOpts) *gitServer {
	t.Helper()
	if o.addr == "" {
		o.addr = "127.0.0.1:0"
	}
	if o.seed == nil {
		o.seed = map[string]string{"README": "seed\n"}
	}
	execPath, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	backend := filepath.Join(strings.TrimSpace(string(execPath)), "git-http-backend")
	if _, err := os.Stat(backend); err != nil {
		t.Fatalf("git-http-backend not found (scripts/deps installs git): %v", err)
	}
	root := credDir(t, -1)
	env := gitEnv(root)
	gitRun(t, root, env, "init", "-q", "--bare", "-b", "main", "repo.git")
	s := &gitServer{Bare: filepath.Join(root, "repo.git"), active: map[net.Conn]time.Time{}}
	s.git(t, "config", "http.receivepack", "true")
	seed := filepath.Join(root, "seed")
	gitRun(t, root, env, "init", "-q", "-b", "main", seed)
	names := make([]string, 0, len(o.seed))
	for name := range o.seed {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(seed, name), []byte(o.seed[name]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitRun(t, seed, env, append([]string{"add", "--"}, names...)...)
	gitRun(t, seed, env, "commit", "-q", "-m", "seed")
	gitRun(t, seed, env, "push", "-q", s.Bare, "main")
	s.Seed = gitRun(t, seed, env, "rev-parse", "HEAD")

	backendEnv := []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1", "HOME=" + root}
	cgiH := &cgi.Handler{Path: backend, Env: backendEnv}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		at, ok := s.active[r.Context().Value(gitConnKey{}).(net.Conn)]
		s.mu.Unlock()
		if !ok {
			at = time.Now()
		}
		rec := gitReq{At: at, Method: r.Method, Path: r.URL.RequestURI()}
		user, pass, hasAuth := r.BasicAuth()
		rec.User = user
		acct, known := o.accounts[user]
		authed := hasAuth && known && pass == acct.password
		push := strings.HasSuffix(r.URL.Path, "/git-receive-pack") || r.URL.Query().Get("service") == "git-receive-pack"
		if !authed && (push || !o.anonFetch) {
			w.Header().Set("WWW-Authenticate", `Basic realm="shim-it"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			rec.Status = http.StatusUnauthorized
		} else {
			r.Header.Del("Authorization")
			sw := &gitStatusWriter{ResponseWriter: w}
			cgiH.ServeHTTP(sw, r)
			rec.Status = sw.code
			if rec.Status == 0 {
				rec.Status = http.StatusOK
			}
			if authed && acct.branch != "" && rec.receivePack() && rec.Status == http.StatusOK {
				out, _ := exec.Command("git", "--git-dir", s.Bare, "rev-parse", "-q", "--verify", "refs/heads/"+acct.branch).Output()
				rec.Tip = strings.TrimSpace(string(out))
			}
		}
		s.mu.Lock()
		s.reqs = append(s.reqs, rec)
		s.mu.Unlock()
	})
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:     handler,
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
	s.URL = "http://" + s.HostPort + "/repo.git"
	return s
}
