package integration

// Issue 4 end to end through the real binary: credentials and network per
// generation. A real git smart-HTTP server (git http-backend behind
// net/http/cgi, basic auth) runs in the test process; harnesses run as uid
// 65534 and get their credentials only from shim's broker.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/testutil"
)

// The uid:gid every harness here runs as: the harness is untrusted.
const credHarnessUser = "65534:65534"

// credDir makes a temp dir that a uid-65534 harness can traverse (mode
// 0755; owned by uid when uid >= 0) and removes it at the end.
func credDir(t testing.TB, uid int) string { t.Helper(); return testutil.HarnessDir(t, uid) }

// credSecret returns a random password that cannot occur by accident.
func credSecret(name string) string {
	b := make([]byte, 16)
	rand.Read(b)
	return "s3cret-" + name + "-" + hex.EncodeToString(b)
}

// credFile writes a --credential-file (root-only, outside the runtime dir).
func credFile(t testing.TB, list []map[string]string) string {
	t.Helper()
	b, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "credentials.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// credHarnessArgs are the start flags every harness here gets: uid 65534,
// its own HOME, a git identity and no system git config.
func credHarnessArgs(home string) []string {
	return []string{
		"--user", credHarnessUser, "--cwd", home,
		"--env", "HOME=" + home, "--env", "GIT_CONFIG_NOSYSTEM=1", "--env", "LC_ALL=C",
		"--env", "GIT_AUTHOR_NAME=harness", "--env", "GIT_AUTHOR_EMAIL=harness@example.invalid",
		"--env", "GIT_COMMITTER_NAME=harness", "--env", "GIT_COMMITTER_EMAIL=harness@example.invalid",
	}
}

// credAudit reads audit.jsonl.
func credAudit(t testing.TB, runtimeDir string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range readLines(filepath.Join(runtimeDir, "audit.jsonl")) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// credFind returns the audit records of event whose fields equal want
// (numbers compare as float64, as JSON decodes them).
func credFind(recs []map[string]any, event string, want map[string]any) []map[string]any {
	var out []map[string]any
next:
	for _, r := range recs {
		if r["event"] != event {
			continue
		}
		for k, v := range want {
			if n, ok := v.(int); ok {
				v = float64(n)
			}
			if r[k] != v {
				continue next
			}
		}
		out = append(out, r)
	}
	return out
}

// credWatchFrozen polls cgroup dir cg and returns a stop function that
// reports when the test first saw it frozen (or gone: frozen, killed and
// removed between two polls); zero if neither was seen. The time is an upper
// bound of the moment the kernel froze it.
func credWatchFrozen(cg string) (stop func() time.Time) {
	done := make(chan struct{})
	res := make(chan time.Time, 1)
	go func() {
		for {
			b, err := os.ReadFile(filepath.Join(cg, "cgroup.events"))
			now := time.Now()
			if err != nil || bytes.Contains(b, []byte("frozen 1")) {
				res <- now
				return
			}
			select {
			case <-done:
				res <- time.Time{}
				return
			default:
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	return func() time.Time { close(done); return <-res }
}

// credHostPids lists the (host) pids in a generation's cgroup.
func credHostPids(cg string) []int {
	b, _ := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// credAskBroker runs `shim credential get` with cmdPrefix (e.g. nsenter)
// against sock and returns its stdout.
func credAskBroker(t testing.TB, sock, host string, cmdPrefix ...string) string {
	t.Helper()
	argv := append(append([]string{}, cmdPrefix...), shimBin, "credential", "get")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SHIM_CRED_SOCK=" + sock}
	cmd.Stdin = strings.NewReader("protocol=http\nhost=" + host + "\npath=repo.git\n\n")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, errb.String())
	}
	return out.String()
}

// credScanForSecrets fails if any secret occurs in any regular file under
// dirs or in any of blobs.
func credScanForSecrets(t testing.TB, secrets []string, blobs map[string]string, dirs ...string) {
	t.Helper()
	files := 0
	for _, d := range dirs {
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				t.Errorf("secret scan: %v", err)
				return nil
			}
			files++
			for _, sec := range secrets {
				if bytes.Contains(b, []byte(sec)) {
					t.Errorf("secret found in %s", p)
				}
			}
			return nil
		})
	}
	for name, b := range blobs {
		for _, sec := range secrets {
			if strings.Contains(b, sec) {
				t.Errorf("secret found in %s", name)
			}
		}
	}
	t.Logf("secret scan: %d files, %d logs, %d secrets: clean unless reported", files, len(blobs), len(secrets))
}

// credStopShim stops shim with SIGTERM so everything it writes at shutdown is
// on disk before the secret scan.
func credStopShim(t testing.TB, s *Shim) {
	t.Helper()
	s.Cmd.Process.Signal(syscall.SIGTERM)
	if _, ok := s.Wait(30 * time.Second); !ok {
		t.Error("shim did not stop on SIGTERM")
		s.Stop()
	}
}

// credPusherScript clones $1 and pushes a new commit "<label> #k" to branch
// <label> in a loop ($2 = label, $3 = how many pushes, 0 = forever), then
// sleeps. First it asks the broker, as this generation, for gen 1's second
// credential ($4 = shim binary, $5 = output file; a password is written as
// PRESENT, never itself).
const credPusherScript = `
url=$1 label=$2 n=$3 shim=$4 cross=$5
printf 'protocol=https\nhost=gen1-only.invalid\npath=org/repo\n\n' | "$shim" credential get 2>"$cross.err" | sed 's/^password=.*/password=PRESENT/' > "$cross.tmp"
mv "$cross.tmp" "$cross"
git clone -q "$url" w || exit 10
cd w || exit 11
git checkout -q -b "$label" || exit 12
k=0
while [ "$n" = 0 ] || [ "$k" -lt "$n" ]; do
  k=$((k+1))
  git commit -q --allow-empty -m "$label #$k" || exit 13
  git push -q origin "$label" || echo "push $k failed" >&2
done
exec sleep 1000
`

// TestCredentialsOnlyForTheCurrentGeneration: gen 1 pushes in a loop with the
// broker's credentials; gen 2 is announced; no push of gen 1 is accepted
// once it is frozen, everything of gen 1 that landed was sent before, gen 2
// pushes, nobody outside the current generation gets a credential, and no
// secret is anywhere on disk or in the logs.
func TestCredentialsOnlyForTheCurrentGeneration(t *testing.T) {
	requireRoot(t)
	pw1, pw2, pw3 := credSecret("gen1"), credSecret("gen2"), credSecret("gen1only")
	srv := startGitServer(t, gitServerOpts{Addr: "127.0.0.1:0", Accounts: map[string]gitAccount{
		"gen1-bot": {Password: pw1, Branch: "gen1"},
		"gen2-bot": {Password: pw2, Branch: "gen2"},
	}})
	rd := credDir(t, -1) // traversable: the harness uid must reach cred.sock
	s := startShim(t, shimOpts{runtimeDir: rd})
	sock := filepath.Join(rd, "cred.sock")
	home1, home2 := credDir(t, 65534), credDir(t, 65534)
	out := credDir(t, 65534)
	cross1, cross2 := filepath.Join(out, "cross1"), filepath.Join(out, "cross2")
	pusher := script(t, credDir(t, -1), "pusher.sh", credPusherScript)

	cf1 := credFile(t, []map[string]string{
		{"protocol": "http", "host": srv.HostPort, "username": "gen1-bot", "password": pw1},
		{"protocol": "https", "host": "gen1-only.invalid", "path": "org", "username": "x-access-token", "token": pw3},
	})
	cf2 := credFile(t, []map[string]string{
		{"protocol": "http", "host": srv.HostPort, "path": "repo.git", "username": "gen2-bot", "token": pw2},
	})

	var r1 api.StartResult
	s.MustCtl(&r1, append(append([]string{"start", "--generation", "1", "--credential-file", cf1}, credHarnessArgs(home1)...),
		"--", pusher, srv.URL, "gen1", "0", shimBin, cross1)...)
	eventually(t, 60*time.Second, "gen 1 pushed 3 times", func() bool { return len(srv.Pushes("gen1-bot")) >= 3 })

	// The harness's environment names the broker and holds no secret.
	sawEnv := false
	for _, pid := range credHostPids(r1.Cgroup) {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			continue
		}
		for _, sec := range []string{pw1, pw2, pw3} {
			if bytes.Contains(env, []byte(sec)) {
				t.Fatalf("secret in the environment of gen 1 pid %d", pid)
			}
		}
		if bytes.Contains(env, []byte("SHIM_CRED_SOCK="+sock+"\x00")) && bytes.Contains(env, []byte("GIT_CONFIG_COUNT=")) &&
			bytes.Contains(env, []byte("GIT_TERMINAL_PROMPT=0")) {
			sawEnv = true
		}
	}
	if !sawEnv {
		t.Errorf("no gen 1 process has SHIM_CRED_SOCK, GIT_CONFIG_COUNT and GIT_TERMINAL_PROMPT=0 in its environment")
	}

	// Announce gen 2 while gen 1 keeps pushing.
	stopWatch := credWatchFrozen(r1.Cgroup)
	tSent := time.Now()
	var r2 api.StartResult
	s.MustCtl(&r2, append(append([]string{"start", "--generation", "2", "--credential-file", cf2}, credHarnessArgs(home2)...),
		"--", pusher, srv.URL, "gen2", "3", shimBin, cross2)...)
	tDone := time.Now()
	tFrozen := stopWatch()
	if tFrozen.IsZero() || tFrozen.After(tDone) {
		t.Logf("freeze not observed by the poller; using the end of the announcement as the boundary")
		tFrozen = tDone
	}

	if len(r2.Fenced) != 1 {
		t.Fatalf("gen 2 should fence gen 1: %+v", r2)
	}
	rep := r2.Fenced[0]
	if rep.Generation != 1 || rep.Survivors != 0 || rep.Cut == nil {
		t.Fatalf("fence report: %+v", rep)
	}
	if rep.Cut.CredentialsRevoked != 2 {
		t.Errorf("cut revoked %d credentials, want 2 (both of gen 1's)", rep.Cut.CredentialsRevoked)
	}
	if _, ok := rep.Cut.DurationsMS["credentials"]; !ok {
		t.Errorf("cut report lacks the credentials duration: %+v", rep.Cut)
	}
	if rep.Cut.LinkDeleted || rep.Cut.TunnelsClosed != 0 {
		t.Errorf("host network has no link or tunnels to cut: %+v", rep.Cut)
	}
	t.Logf("fence: durations %v, cut %+v", rep.DurationsMS, *rep.Cut)

	// Gen 2 pushes with its own (path-scoped, "token"-alias) credential.
	eventually(t, 60*time.Second, "gen 2 pushed 3 times", func() bool { return len(srv.Pushes("gen2-bot")) >= 3 })
	if got := srv.Git(t, "log", "--format=%s", "refs/heads/gen2"); !strings.HasPrefix(got, "gen2 #3\ngen2 #2\ngen2 #1\nseed") {
		t.Errorf("gen2 branch history:\n%s", got)
	}

	// No push of gen 1 accepted once it was frozen; nothing at all from gen 1
	// once the announcement returned (it is dead).
	var before, window int
	tips := map[string]bool{}
	for _, r := range srv.Requests() {
		if r.User != "gen1-bot" {
			continue
		}
		if r.At.After(tDone) {
			t.Errorf("gen 1 request after the fence completed: %+v", r)
		}
		if !r.ReceivePack() || r.Status != http.StatusOK {
			continue
		}
		switch {
		case r.At.After(tFrozen):
			t.Errorf("gen 1 push accepted after it was frozen (%v after): %+v", r.At.Sub(tFrozen), r)
		case r.At.After(tSent):
			window++
			tips[r.Tip] = true
		default:
			before++
			tips[r.Tip] = true
		}
	}
	t.Logf("gen 1 pushes accepted: %d before the announcement, %d between it and the freeze (%v)", before, window, tFrozen.Sub(tSent))
	// The bare repository: gen1's tip is one a push sent before the freeze
	// left, and its history is gen 1's commits only.
	tip := srv.Git(t, "rev-parse", "refs/heads/gen1")
	if !tips[tip] {
		t.Errorf("gen1 branch tip %s was not left by a push that reached the server before the freeze", tip)
	}
	hist := strings.Split(srv.Git(t, "log", "--format=%s", "refs/heads/gen1"), "\n")
	for i, m := range hist {
		want := fmt.Sprintf("gen1 #%d", len(hist)-1-i)
		if i == len(hist)-1 {
			want = "seed"
		}
		if m != want {
			t.Errorf("gen1 history line %d: %q, want %q", i, m, want)
		}
	}

	// Credential requests from outside any generation get nothing: the test
	// process (outside shim's pid namespace: no pid) ...
	if got := credAskBroker(t, sock, srv.HostPort); got != "" {
		t.Errorf("broker answered a process outside shim's pid namespace: %d bytes", len(got))
	}
	// ... and a process inside shim's pid namespace but in no generation.
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Errorf("nsenter not found (util-linux): cannot ask from inside shim's pid namespace")
	} else if got := credAskBroker(t, sock, srv.HostPort, nsenter, "-t", strconv.Itoa(s.Cmd.Process.Pid), "-p", "--"); got != "" {
		t.Errorf("broker answered a process in shim's pid namespace outside any generation: %d bytes", len(got))
	}
	// A generation asking for a credential only another generation holds
	// gets nothing; gen 1 itself was answered for it.
	eventually(t, 10*time.Second, "gen 2's cross-generation request done", func() bool { _, err := os.Stat(cross2); return err == nil })
	if b, _ := os.ReadFile(cross2); len(b) != 0 {
		t.Errorf("gen 2 got an answer for gen 1's credential: %d bytes", len(b))
	}

	audit := credAudit(t, rd)
	if n := len(credFind(audit, "credential_granted", map[string]any{"generation": 1, "username": "gen1-bot"})); n == 0 {
		t.Errorf("no credential_granted record for gen 1")
	}
	if n := len(credFind(audit, "credential_granted", map[string]any{"generation": 2, "username": "gen2-bot"})); n == 0 {
		t.Errorf("no credential_granted record for gen 2")
	}
	for _, want := range []map[string]any{
		{"reason": "peer_unknown"},
		{"reason": "not_a_generation"},
		{"reason": "no_matching_credential", "generation": 2, "host": "gen1-only.invalid"},
	} {
		if len(credFind(audit, "credential_refused", want)) == 0 {
			t.Errorf("no credential_refused record with %v; refusals: %v", want, credFind(audit, "credential_refused", nil))
		}
	}
	if b, _ := os.ReadFile(cross1); !strings.Contains(string(b), "username=x-access-token\npassword=PRESENT\n") {
		t.Errorf("gen 1 did not get its own path-scoped credential for gen1-only.invalid/org/repo")
	}

	credStopShim(t, s)
	credScanForSecrets(t, []string{pw1, pw2, pw3}, map[string]string{"shim log": s.Log.String()},
		rd, home1, home2, out, filepath.Dir(srv.Bare))
}

// credClientSrc is a tiny TCP client a harness runs inside its isolated
// network:
//
//	client direct - HOST:PORT OUT    dial HOST:PORT without the proxy
//	client status PROXY HOST:PORT OUT  CONNECT through PROXY, write the status
//	client hold PROXY HOST:PORT OUT  CONNECT, say hello, hold the tunnel open
const credClientSrc = `package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	mode, proxy, target, out := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	put := func(s string) { os.WriteFile(out+".tmp", []byte(s+"\n"), 0o644); os.Rename(out+".tmp", out) }
	if mode == "direct" {
		c, err := net.DialTimeout("tcp", target, 3*time.Second)
		if err != nil {
			put("error: " + err.Error())
			return
		}
		c.Close()
		put("connected")
		return
	}
	proxy = strings.TrimSuffix(strings.TrimPrefix(proxy, "http://"), "/")
	c, err := net.DialTimeout("tcp", proxy, 3*time.Second)
	if err != nil {
		put("error: " + err.Error())
		os.Exit(1)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		put("error: " + err.Error())
		os.Exit(1)
	}
	if mode == "status" || resp.StatusCode != 200 {
		put(strconv.Itoa(resp.StatusCode))
		return
	}
	fmt.Fprintf(c, "hello from generation %s\n", os.Getenv("SHIM_GENERATION"))
	put("connected")
	io.Copy(io.Discard, br)
	put("closed")
	select {}
}
`

// buildCredClient builds credClientSrc into a dir a uid-65534 harness can use.
func buildCredClient(t *testing.T) string {
	t.Helper()
	dir := credDir(t, -1)
	src := filepath.Join(dir, "client.go")
	if err := os.WriteFile(src, []byte(credClientSrc), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client")
	cmd := exec.Command("go", "build", "-o", bin, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build client: %v\n%s", err, out)
	}
	return bin
}

// credTCPConn is one connection a credTCPServer accepted.
type credTCPConn struct {
	Hello    string
	ClosedAt time.Time
}

// credTCPServer accepts connections, reads lines until EOF and records them.
type credTCPServer struct {
	Addr  string
	mu    sync.Mutex
	conns []*credTCPConn
}

func (s *credTCPServer) snapshot() []credTCPConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]credTCPConn, len(s.conns))
	for i, c := range s.conns {
		out[i] = *c
	}
	return out
}

func startCredTCPServer(t *testing.T, addr string) *credTCPServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &credTCPServer{Addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var open sync.Map
	t.Cleanup(func() {
		ln.Close()
		open.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rec := &credTCPConn{}
			s.mu.Lock()
			s.conns = append(s.conns, rec)
			s.mu.Unlock()
			open.Store(c, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer open.Delete(c)
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					s.mu.Lock()
					if rec.Hello == "" {
						rec.Hello = sc.Text()
					}
					s.mu.Unlock()
				}
				s.mu.Lock()
				rec.ClosedAt = time.Now()
				s.mu.Unlock()
			}()
		}
	}()
	return s
}

// credIsolatedScript clones $1 through the proxy, pushes a commit to branch
// $2, checks that the network has no way out but the proxy ($3 = client,
// $4 = an allowed host:port dialled directly, $5 = a forbidden host:port
// through the proxy, $6 = output dir) and then holds a tunnel to $4 (when
// $7 = hold) or sleeps.
const credIsolatedScript = `
url=$1 branch=$2 client=$3 allowed=$4 forbidden=$5 out=$6 then=$7
git clone -q "$url" w 2>"$out/git.err" || exit 10
cd w || exit 11
git checkout -q -b "$branch" && git commit -q --allow-empty -m "$branch" && git push -q origin "$branch" 2>>"$out/git.err" && echo ok > "$out/pushed"
"$client" direct - "$allowed" "$out/direct"
"$client" status "$HTTP_PROXY" "$forbidden" "$out/forbidden"
if [ "$then" = hold ]; then exec "$client" hold "$HTTP_PROXY" "$allowed" "$out/hold"; fi
exec sleep 1000
`

// TestIsolatedNetworkCutAtFence: an isolated generation reaches only the
// allowed host:ports and only through shim's proxy; git pushes through it
// with the broker's credential; a TCP tunnel it holds through the proxy is
// closed at the fence (the server sees it end), the report says so, and the
// next isolated generation pushes again.
func TestIsolatedNetworkCutAtFence(t *testing.T) {
	requireRoot(t)
	client := buildCredClient(t)
	pw := credSecret("iso")
	// 127.0.0.2: NO_PROXY covers 127.0.0.1 and localhost, which inside an
	// isolated namespace are the generation's own loopback.
	srv := startGitServer(t, gitServerOpts{Addr: "127.0.0.2:0", Accounts: map[string]gitAccount{"iso-bot": {Password: pw, Branch: "iso1"}}})
	echo := startCredTCPServer(t, "127.0.0.2:0")
	forbidden := startCredTCPServer(t, "127.0.0.2:0")
	rd := credDir(t, -1)
	s := startShim(t, shimOpts{runtimeDir: rd})
	cf := credFile(t, []map[string]string{{"protocol": "http", "host": srv.HostPort, "username": "iso-bot", "password": pw}})
	isoScript := script(t, credDir(t, -1), "iso.sh", credIsolatedScript)

	start := func(n int, branch, then string) (api.StartResult, string, string) {
		home, out := credDir(t, 65534), credDir(t, 65534)
		var r api.StartResult
		args := append([]string{"start", "--generation", strconv.Itoa(n), "--credential-file", cf,
			"--network", "isolated", "--allow", srv.HostPort, "--allow", echo.Addr}, credHarnessArgs(home)...)
		s.MustCtl(&r, append(args, "--", isoScript, srv.URL, branch, client, echo.Addr, forbidden.Addr, out, then)...)
		return r, home, out
	}
	read := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }

	r1, home1, out1 := start(1, "iso1", "hold")
	// Both sides of the tunnel: the server saw the hello, and the client
	// wrote down that it is connected (it may do so after the hello went
	// out: reading the file at once lost that race under a second suite).
	eventually(t, 60*time.Second, "gen 1 holds a tunnel to the echo server", func() bool {
		c := echo.snapshot()
		return len(c) == 1 && c[0].Hello == "hello from generation 1" && read(filepath.Join(out1, "hold")) == "connected"
	})
	if got := read(filepath.Join(out1, "pushed")); got != "ok" {
		t.Errorf("gen 1 push through the proxy: %q; git: %s", got, read(filepath.Join(out1, "git.err")))
	}
	if got := read(filepath.Join(out1, "forbidden")); got != "403" {
		t.Errorf("CONNECT to a host:port not on the allowlist: %q, want 403", got)
	}
	if got := read(filepath.Join(out1, "direct")); !strings.HasPrefix(got, "error:") {
		t.Errorf("direct connection from the isolated namespace: %q, want an error", got)
	}
	if n := len(forbidden.snapshot()); n != 0 {
		t.Errorf("the forbidden server saw %d connections", n)
	}
	if got := read(filepath.Join(out1, "hold")); got != "connected" {
		t.Errorf("gen 1 tunnel client: %q", got)
	}

	tSent := time.Now()
	r2, home2, out2 := start(2, "iso2", "sleep")
	tDone := time.Now()
	if len(r2.Fenced) != 1 || r2.Fenced[0].Generation != 1 || r2.Fenced[0].Survivors != 0 || r2.Fenced[0].Cut == nil {
		t.Fatalf("fence report: %+v", r2.Fenced)
	}
	cut := r2.Fenced[0].Cut
	if cut.TunnelsClosed < 1 || !cut.LinkDeleted || cut.CredentialsRevoked != 1 {
		t.Errorf("cut report: %+v (want tunnels_closed >= 1, link_deleted, credentials_revoked 1)", *cut)
	}
	for _, k := range []string{"credentials", "tunnels", "link"} {
		if _, ok := cut.DurationsMS[k]; !ok {
			t.Errorf("cut report lacks the %s duration: %v", k, cut.DurationsMS)
		}
	}
	t.Logf("fence: durations %v, cut %+v", r2.Fenced[0].DurationsMS, *cut)
	eventually(t, 10*time.Second, "the echo server sees gen 1's tunnel closed", func() bool {
		return !echo.snapshot()[0].ClosedAt.IsZero()
	})
	closedAt := echo.snapshot()[0].ClosedAt
	t.Logf("tunnel closed at the server %v after the announcement was sent (announcement took %v)", closedAt.Sub(tSent), tDone.Sub(tSent))

	// The next isolated generation pushes through its own proxy.
	eventually(t, 60*time.Second, "gen 2 pushed", func() bool { return read(filepath.Join(out2, "pushed")) == "ok" })
	if got := srv.Git(t, "log", "-1", "--format=%s", "refs/heads/iso2"); got != "iso2" {
		t.Errorf("iso2 branch: %q", got)
	}
	if got := srv.Git(t, "log", "-1", "--format=%s", "refs/heads/iso1"); got != "iso1" {
		t.Errorf("iso1 branch: %q", got)
	}
	eventually(t, 10*time.Second, "gen 2's forbidden check", func() bool { return read(filepath.Join(out2, "forbidden")) != "" })
	if got := read(filepath.Join(out2, "forbidden")); got != "403" {
		t.Errorf("gen 2 CONNECT to a forbidden host:port: %q", got)
	}
	if len(echo.snapshot()) != 1 {
		t.Errorf("echo server connections: %+v", echo.snapshot())
	}
	if r2.Network == nil {
		t.Errorf("start result lacks the network section")
	}

	audit := credAudit(t, rd)
	for _, c := range []struct {
		event string
		want  map[string]any
	}{
		{"connection_opened", map[string]any{"generation": 1, "kind": "connect", "target": echo.Addr}},
		{"connection_opened", map[string]any{"generation": 1, "kind": "http", "target": srv.HostPort}},
		{"connection_closed", map[string]any{"generation": 1, "kind": "connect", "target": echo.Addr, "cut": true}},
		{"connection_refused", map[string]any{"generation": 1, "target": forbidden.Addr, "reason": "not_allowed"}},
		{"connection_opened", map[string]any{"generation": 2, "kind": "http", "target": srv.HostPort}},
		{"credential_granted", map[string]any{"generation": 1, "username": "iso-bot"}},
		{"credential_granted", map[string]any{"generation": 2, "username": "iso-bot"}},
	} {
		if len(credFind(audit, c.event, c.want)) == 0 {
			t.Errorf("no %s audit record with %v", c.event, c.want)
		}
	}
	_ = r1

	credStopShim(t, s)
	credScanForSecrets(t, []string{pw}, map[string]string{"shim log": s.Log.String()},
		rd, home1, home2, out1, out2, filepath.Dir(srv.Bare))
}

// TestCredentialSocketMustBeReachable: a start that grants credentials to a
// harness user who cannot reach cred.sock (a parent of the runtime dir is
// closed to it) is refused with the reason, instead of starting a harness
// whose git fails to authenticate; the same start without credentials, or
// as root, runs.
func TestCredentialSocketMustBeReachable(t *testing.T) {
	requireRoot(t)
	parent := credDir(t, -1)
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	rd := filepath.Join(parent, "run")
	s := startShim(t, shimOpts{runtimeDir: rd})
	pw := credSecret("unreachable")
	cf := credFile(t, []map[string]string{{"protocol": "https", "host": "example.invalid", "username": "u", "password": pw}})
	home := credDir(t, 65534)

	_, errs, code := s.Ctl(append(append([]string{"start", "--generation", "1", "--credential-file", cf}, credHarnessArgs(home)...), "--", "sleep", "1000")...)
	if code == 0 || !strings.Contains(errs, api.CodeStartFailed) || !strings.Contains(errs, parent) {
		t.Fatalf("start with credentials the harness cannot reach: exit %d, %s", code, errs)
	}
	if strings.Contains(errs, pw) {
		t.Fatal("the refusal quotes the secret")
	}
	s.MustCtl(nil, append(append([]string{"start", "--generation", "2"}, credHarnessArgs(home)...), "--", "sleep", "1000")...)
	s.MustCtl(nil, "start", "--generation", "3", "--credential-file", cf, "--", "sleep", "1000")
	credStopShim(t, s)
	credScanForSecrets(t, []string{pw}, map[string]string{"shim log": s.Log.String(), "ctl stderr": errs}, rd)
}

// TestIsolatedReachesAllowedLoopbackService: a sandbox service on
// 127.0.0.1 that the supervisor allows is reached through the proxy once the
// supervisor's NO_PROXY leaves 127.0.0.1 out; with shim's default NO_PROXY
// (loopback = the generation's own) git goes direct and cannot connect.
func TestIsolatedReachesAllowedLoopbackService(t *testing.T) {
	requireRoot(t)
	pw := credSecret("loopback")
	srv := startGitServer(t, gitServerOpts{Addr: "127.0.0.1:0", Accounts: map[string]gitAccount{"lo-bot": {Password: pw, Branch: "lo"}}})
	rd := credDir(t, -1)
	s := startShim(t, shimOpts{runtimeDir: rd})
	cf := credFile(t, []map[string]string{{"protocol": "http", "host": srv.HostPort, "username": "lo-bot", "password": pw}})
	sc := script(t, credDir(t, -1), "ls.sh", `git ls-remote "$1" > "$2/out" 2> "$2/err"; echo $? > "$2/rc.tmp"; mv "$2/rc.tmp" "$2/rc"; exec sleep 1000`)
	for i, c := range []struct {
		env  []string
		want string
	}{
		{nil, "128"},
		{[]string{"--env", "NO_PROXY=localhost,::1"}, "0"},
	} {
		home, out := credDir(t, 65534), credDir(t, 65534)
		args := append([]string{"start", "--generation", strconv.Itoa(i + 1), "--credential-file", cf,
			"--network", "isolated", "--allow", srv.HostPort}, credHarnessArgs(home)...)
		s.MustCtl(nil, append(append(args, c.env...), "--", sc, srv.URL, out)...)
		rc := filepath.Join(out, "rc")
		eventually(t, 30*time.Second, "git ls-remote done", func() bool { _, err := os.Stat(rc); return err == nil })
		b, _ := os.ReadFile(rc)
		if got := strings.TrimSpace(string(b)); got != c.want {
			e, _ := os.ReadFile(filepath.Join(out, "err"))
			t.Errorf("generation %d (env %v): git ls-remote exit %s, want %s\n%s", i+1, c.env, got, c.want, e)
		}
	}
	audit := credAudit(t, rd)
	if len(credFind(audit, "connection_opened", map[string]any{"generation": 2, "target": srv.HostPort})) == 0 {
		t.Errorf("generation 2 did not go through the proxy")
	}
	if len(credFind(audit, "connection_opened", map[string]any{"generation": 1})) != 0 {
		t.Errorf("generation 1 used the proxy despite NO_PROXY")
	}
	credStopShim(t, s)
	credScanForSecrets(t, []string{pw}, map[string]string{"shim log": s.Log.String()}, rd)
}

// TestStartRequestCredentialsOverAPI: the same credentials in the API's
// start request (what docs/credentials.md shows with curl) reach the
// harness's git; an invalid credential is refused with BAD_REQUEST instead
// of being dropped, and no refusal quotes the secret.
func TestStartRequestCredentialsOverAPI(t *testing.T) {
	requireRoot(t)
	pw := credSecret("api")
	srv := startGitServer(t, gitServerOpts{Addr: "127.0.0.1:0", Accounts: map[string]gitAccount{"api-bot": {Password: pw, Branch: "api"}}})
	rd := credDir(t, -1)
	s := startShim(t, shimOpts{runtimeDir: rd})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(rd, "shim.sock"))
	}}}
	post := func(body map[string]any) (int, string) {
		b, _ := json.Marshal(body)
		resp, err := hc.Post("http://shim/v1/generations", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		out.ReadFrom(resp.Body)
		return resp.StatusCode, out.String()
	}
	home, out := credDir(t, 65534), credDir(t, 65534)
	sc := script(t, credDir(t, -1), "ls.sh", `git ls-remote "$1" > "$2/out" 2> "$2/err"; echo $? > "$2/rc.tmp"; mv "$2/rc.tmp" "$2/rc"; exec sleep 1000`)
	req := func(gen int, cred map[string]any) map[string]any {
		return map[string]any{
			"generation": gen, "command": []string{sc, srv.URL, out}, "user": credHarnessUser, "cwd": home,
			"env":         []string{"HOME=" + home, "GIT_CONFIG_NOSYSTEM=1"},
			"credentials": []map[string]any{cred},
		}
	}
	var answers []string
	for _, bad := range []map[string]any{
		{"protocol": "http", "host": srv.HostPort + "/repo.git", "username": "api-bot", "password": pw},
		{"protocol": "http", "host": srv.HostPort, "username": "api-bot", "password": pw + "\n"},
		{"protocol": "http", "host": srv.HostPort, "username": "api-bot", "token": pw},
	} {
		code, body := post(req(1, bad))
		answers = append(answers, body)
		if code != http.StatusBadRequest || !strings.Contains(body, api.CodeBadRequest) {
			t.Errorf("invalid credential %v: HTTP %d %s", bad["host"], code, body)
		}
	}
	code, body := post(req(1, map[string]any{"protocol": "http", "host": srv.HostPort, "path": "repo.git", "username": "api-bot", "password": pw}))
	if code != http.StatusCreated {
		t.Fatalf("start over the API: HTTP %d %s", code, body)
	}
	rc := filepath.Join(out, "rc")
	eventually(t, 30*time.Second, "git ls-remote done", func() bool { _, err := os.Stat(rc); return err == nil })
	if b, _ := os.ReadFile(rc); strings.TrimSpace(string(b)) != "0" {
		e, _ := os.ReadFile(filepath.Join(out, "err"))
		t.Errorf("git ls-remote with the API's credential: exit %s\n%s", b, e)
	}
	credStopShim(t, s)
	credScanForSecrets(t, []string{pw}, map[string]string{"shim log": s.Log.String(), "API answers": strings.Join(answers, "\n")}, rd, home, out)
}
