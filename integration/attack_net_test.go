package integration

// Issue 8's network attacks (the helpers are attack_test.go's): a push in
// flight at the fence, against a git server slow to read it, must never
// land (host and isolated mode; the control shows it lands when the
// generation is only frozen and killed); and shim's own fetch at a fence
// must put its credential in no process's environment or argv.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
)

// atkSlowProxy is a TCP proxy in front of the git server that reads what
// clients send slowly (chunk bytes every 10 ms, into a 32 KiB receive
// buffer): a server slow to read, so that a push's pack queues in the
// sender's socket. stall delays each connection's first bytes (a slow
// server for shim's own fetch). Loopback only.
type atkSlowProxy struct {
	Addr   string
	target string
	chunk  int
	stall  time.Duration

	mu    sync.Mutex
	conns []*atkSlowConn
}

// atkSlowConn is one connection through the proxy.
type atkSlowConn struct {
	up      int64  // bytes read from the client and forwarded
	howEnds string // how the client's side ended: "eof", "reset" or an error
	done    bool   // both directions over, upstream closed
	// want is where the last request whose header was read ends (see
	// request); start, end, inBody and head follow the request being
	// read. client and local are the connection's ends.
	want, start, end int64
	inBody           bool
	head             []byte
	client, local    string
}

func startAtkSlowProxy(t testing.TB, target string, chunk int, stall time.Duration) *atkSlowProxy {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 32<<10) })
		return err
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &atkSlowProxy{Addr: ln.Addr().String(), target: target, chunk: chunk, stall: stall}
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
			open.Store(c, true)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer open.Delete(c)
				p.relay(c)
			}()
		}
	}()
	return p
}

func (p *atkSlowProxy) relay(c net.Conn) {
	defer c.Close()
	rec := &atkSlowConn{client: c.RemoteAddr().String(), local: c.LocalAddr().String()}
	p.mu.Lock()
	p.conns = append(p.conns, rec)
	p.mu.Unlock()
	defer func() { p.mu.Lock(); rec.done = true; p.mu.Unlock() }()
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		p.mu.Lock()
		rec.howEnds = "upstream: " + err.Error()
		p.mu.Unlock()
		return
	}
	defer u.Close()
	down := make(chan struct{})
	go func() {
		defer close(down)
		io.Copy(c, u)
		c.(*net.TCPConn).CloseWrite()
	}()
	time.Sleep(p.stall) // a slow server, not a synchronisation
	buf := make([]byte, p.chunk)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := u.Write(buf[:n]); werr != nil {
				err = werr
			}
			p.mu.Lock()
			rec.up += int64(n)
			rec.request(buf[:n])
			p.mu.Unlock()
		}
		if err != nil {
			how := err.Error()
			switch {
			case errors.Is(err, io.EOF):
				how = "eof"
				u.(*net.TCPConn).CloseWrite() // the request is whole: let the server answer
			case errors.Is(err, syscall.ECONNRESET):
				how = "reset"
				u.(*net.TCPConn).SetLinger(0) // the client is gone: so is its request
				u.Close()
			default:
				u.Close()
			}
			p.mu.Lock()
			rec.howEnds = how
			p.mu.Unlock()
			break
		}
		time.Sleep(10 * time.Millisecond) // the slow reader's pace
	}
	<-down
}

// request follows the requests the client sends on the connection (one
// after the other, kept alive): b is what it read last. want becomes the
// end of the last request whose header was read (its Content-Length
// after it; none for a request without a body), -1 for one of no fixed
// length.
func (c *atkSlowConn) request(b []byte) {
	pos := c.up - int64(len(b)) // where b begins in the connection
	for len(b) > 0 && c.want >= 0 {
		if c.inBody {
			n := min(int64(len(b)), c.end-pos)
			b, pos = b[n:], pos+n
			if pos == c.end {
				c.inBody, c.start = false, pos
			}
			continue
		}
		c.head = append(c.head, b...)
		i := bytes.Index(c.head, []byte("\r\n\r\n"))
		if i < 0 {
			if len(c.head) > 64<<10 {
				c.want = -1
			}
			return
		}
		length := int64(0)
		for _, l := range strings.Split(string(c.head[:i]), "\r\n") {
			k, v, _ := strings.Cut(l, ":")
			switch {
			case strings.EqualFold(k, "Transfer-Encoding"):
				c.want = -1
				return
			case strings.EqualFold(k, "Content-Length"):
				length, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		c.end = c.start + int64(i+4) + length
		c.want = c.end
		b, pos = c.head[i+4:], c.start+int64(i+4)
		c.head = nil
		c.inBody = true
		if length == 0 {
			c.inBody, c.start = false, c.end
		}
	}
}

// allQueued reports whether the biggest connection's client has handed
// its whole request to the kernel: what the proxy read, what waits in
// its socket and what waits in the client's (/proc/net/tcp) make the
// request's length. Only then does a kill of the client leave a request
// the kernel can still deliver whole.
func (p *atkSlowProxy) allQueued(t testing.TB) bool {
	p.mu.Lock()
	var big *atkSlowConn
	for _, c := range p.conns {
		if big == nil || c.up > big.up {
			big = c
		}
	}
	if big == nil || big.want <= 0 {
		p.mu.Unlock()
		return false
	}
	up, want, client, local := big.up, big.want, big.client, big.local
	p.mu.Unlock()
	_, rx := atkTCPQueues(t, local, client)
	tx, _ := atkTCPQueues(t, client, local)
	return up+rx+tx >= want
}

// atkTCPQueues is the send and receive queue of the IPv4 TCP socket
// from local to remote (host:port each), from /proc/net/tcp.
func atkTCPQueues(t testing.TB, local, remote string) (tx, rx int64) {
	hexAddr := func(a string) string {
		ap, err := netip.ParseAddrPort(a)
		if err != nil || !ap.Addr().Is4() {
			t.Fatalf("not an IPv4 address: %q", a)
		}
		ip := ap.Addr().As4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], ap.Port())
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	l, r := hexAddr(local), hexAddr(remote)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[1] != l || f[2] != r {
			continue
		}
		q := strings.SplitN(f[4], ":", 2)
		if len(q) == 2 {
			tx, _ = strconv.ParseInt(q[0], 16, 64)
			rx, _ = strconv.ParseInt(q[1], 16, 64)
		}
		return tx, rx
	}
	return 0, 0
}

// maxUp is the most bytes any one connection sent through the proxy.
func (p *atkSlowProxy) maxUp() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var m int64
	for _, c := range p.conns {
		m = max(m, c.up)
	}
	return m
}

// settled reports whether every connection is over, and how the biggest
// one ended.
func (p *atkSlowProxy) settled() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var big *atkSlowConn
	for _, c := range p.conns {
		if !c.done {
			return false, ""
		}
		if big == nil || c.up > big.up {
			big = c
		}
	}
	if big == nil {
		return false, ""
	}
	return true, big.howEnds
}

// atkWaitSettled waits until every connection through the proxy is over
// and the git server has none open (so any request it was sent is
// finished or failed), and returns how the biggest one ended. A request
// body cut short can never arrive whole once the proxy is done: the
// server's git-http-backend for it is ended (git 2.39 spins forever on a
// fixed-length body that ends early).
func atkWaitSettled(t testing.TB, p *atkSlowProxy, srv *gitServer) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, how := p.settled()
		if ok {
			atkKillBackends(srv, p.maxUp())
		}
		if ok && srv.OpenConns() == 0 {
			return how
		}
		if time.Now().After(deadline) {
			p.mu.Lock()
			var conns []string
			for _, c := range p.conns {
				conns = append(conns, fmt.Sprintf("%+v", *c))
			}
			p.mu.Unlock()
			t.Fatalf("the slow server is not done after 60s: proxy connections %v, git server connections open %d", conns, srv.OpenConns())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// atkKillBackends kills the git-http-backend processes the test's git
// server started (children of this test process serving srv's root) for a
// request body longer than what could still reach them (max bytes;
// max < 0: every one), with their descendants.
func atkKillBackends(srv *gitServer, max int64) {
	root := srv.Root
	for _, pid := range atkChildren(os.Getpid()) {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || !strings.Contains("\x00"+string(env), "\x00GIT_PROJECT_ROOT="+root+"\x00") {
			continue
		}
		length := int64(-1)
		for _, kv := range strings.Split(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, "CONTENT_LENGTH="); ok {
				fmt.Sscan(v, &length)
			}
		}
		if max >= 0 && length <= max {
			continue
		}
		for _, p := range append(atkDescendants(pid), pid) {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// atkChildren lists the children of pid.
func atkChildren(ppid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := strings.LastIndexByte(string(b), ')'); err == nil && i > 0 {
			var state string
			var pp int
			fmt.Sscan(string(b[i+1:]), &state, &pp)
			if pp == ppid {
				out = append(out, pid)
			}
		}
	}
	return out
}

func atkDescendants(pid int) []int {
	var out []int
	for _, c := range atkChildren(pid) {
		out = append(append(out, atkDescendants(c)...), c)
	}
	return out
}

// atkGitServer is startGitServer whose stuck backends (a body cut short)
// are ended before the server closes.
func atkGitServer(t testing.TB, o gitServerOpts) *gitServer {
	srv := startGitServer(t, o)
	t.Cleanup(func() { atkKillBackends(srv, -1) })
	return srv
}

// atkPushSh clones $1, commits 2.5 MiB of random bytes and pushes them to
// main (the hammer beside it), recording the commit and git's exit code.
// The pack goes in one request with a Content-Length (http.postBuffer above
// its size): the test server's CGI refuses chunked request bodies.
const atkPushSh = `
hammer
URL=$1
git clone -q "$URL" w 2> "$ATTACK_OUT/clone.err" || exit 10
cd w || exit 11
head -c 2621440 /dev/urandom > big.bin
git add big.bin && git commit -qm "big push" || exit 12
git rev-parse HEAD > "$ATTACK_OUT/commit"
touch "$ATTACK_OUT/ready"
git -c http.postBuffer=16777216 push -q origin HEAD:main 2> "$ATTACK_OUT/push.err"
echo $? > "$ATTACK_OUT/push.rc"
exec sleep 1000
`

// atkPushTrigger is how much of the push the slow server must have read
// before the announcement: the pack is being uploaded, most of it queued.
const atkPushTrigger = 256 << 10

// 4. A push written just before the freeze to a server slow to read it:
// the cut aborts the connection (RST, the send queue dropped), the push
// never lands, and the fence report lists the connection.
func TestAttackInFlightPush(t *testing.T) {
	for _, mode := range []string{"host", "isolated"} {
		t.Run(mode, func(t *testing.T) {
			pw := credSecret("push")
			srv := atkGitServer(t, gitServerOpts{Accounts: map[string]gitAccount{"bot": {Password: pw, Branch: "main"}}})
			proxy := startAtkSlowProxy(t, srv.HostPort, 16<<10, 0)
			url := "http://" + proxy.Addr + "/repo.git"
			a := newAtkRig(t, shimOpts{}, map[string]string{"protocol": "http", "host": proxy.Addr, "path": "repo.git", "username": "bot", "password": pw})
			netArgs := []string{}
			if mode == "isolated" {
				// 127.0.0.1 through the proxy: NO_PROXY without it.
				netArgs = []string{"--network", "isolated", "--allow", proxy.Addr, "--env", "NO_PROXY=localhost,::1"}
			}
			g1 := a.script(credDir(t, -1), "push.sh", atkPushSh)
			var r1 api.StartResult
			a.s.MustCtl(&r1, a.plainArgs(1, append(netArgs, "--", g1, url)...)...)
			a.waitReady(1, 60*time.Second)
			eventually(t, 60*time.Second, "the push uploading", func() bool { return proxy.maxUp() > atkPushTrigger })

			x := a.announce(1, 60*time.Second, a.plainArgs(2, "--", "sleep", "1000")...)
			if x.code != 0 {
				t.Fatalf("announcing gen 2: exit %d %s", x.code, strings.TrimSpace(x.errs))
			}
			var r2 api.StartResult
			if err := json.Unmarshal([]byte(x.out), &r2); err != nil || len(r2.Fenced) != 1 || r2.Fenced[0].Cut == nil {
				t.Fatalf("start 2: %q", x.out)
			}
			a.checkGone(x, 1, r1.Cgroup, a.out)
			rep := r2.Fenced[0]

			// Wait for the server's side to be over, then look at the ref.
			how := atkWaitSettled(t, proxy, srv)
			commit := strings.TrimSpace(readString(t, filepath.Join(a.out, "commit")))
			if got := srv.Ref("refs/heads/main"); got != srv.Seed {
				t.Errorf("main is %s after the fence (gen 1's push %s, seed %s): the push landed", got, commit, srv.Seed)
			}
			var listed []api.Connection
			for _, c := range rep.Cut.Connections {
				if strings.HasSuffix(c.Remote, proxy.Addr) || c.Target == proxy.Addr {
					listed = append(listed, c)
				}
			}
			found := false
			for _, c := range listed {
				found = found || c.SendQueue > 0 || c.InFlight
			}
			if !found {
				b, _ := json.Marshal(rep.Cut)
				t.Errorf("the cut report lists no connection to %s with send_queue > 0 or in_flight: %s", proxy.Addr, b)
			}
			b, _ := json.Marshal(listed)
			t.Logf("%s: the server's side ended with %q after %d of the pack's bytes; cut %+v; connections %s; fence ms %v",
				mode, how, proxy.maxUp(), *rep.Cut, b, rep.DurationsMS)
			a.checkServing()
			t.Logf("SIGTERM to exit: %v", a.stop())
		})
	}
}

// The control of TestAttackInFlightPush: the same push, from a process the
// test runs in a cgroup of its own, frozen and killed there without any
// cut, lands after the kill: the kernel flushes what was queued.
func TestAttackInFlightPushControl(t *testing.T) {
	requireRoot(t)
	pw := credSecret("control")
	srv := atkGitServer(t, gitServerOpts{Accounts: map[string]gitAccount{"bot": {Password: pw, Branch: "main"}}})
	proxy := startAtkSlowProxy(t, srv.HostPort, 16<<10, 0)
	work := credDir(t, wtUID)
	w := filepath.Join(work, "w")
	hgit(t, work, "clone", "-q", srv.Bare, w)
	if err := os.WriteFile(filepath.Join(w, "big.bin"), atkRandom(t, 2621440), 0o644); err != nil {
		t.Fatal(err)
	}
	hgit(t, w, "add", "big.bin")
	hgit(t, w, "commit", "-qm", "big push")
	commit := hgit(t, w, "rev-parse", "HEAD")
	chownR(t, work, wtUID)

	cg := filepath.Join(cgroup2Mount(), randName("shim-it-ctl-"))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeCgroupTree(t, cg) })
	fd, err := unix.Open(cg, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	push := exec.Command("git", "-c", "safe.directory=*", "-c", "http.postBuffer=16777216", "push", "-q", fmt.Sprintf("http://bot:%s@%s/repo.git", pw, proxy.Addr), "HEAD:main")
	push.Dir = w
	push.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + work, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0"}
	push.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd,
		Credential: &syscall.Credential{Uid: wtUID, Gid: wtUID, Groups: []uint32{}}}
	if err := push.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { push.Wait(); close(waited) }()
	eventually(t, 60*time.Second, "the push uploading", func() bool { return proxy.maxUp() > atkPushTrigger })
	// The kernel can deliver only what git wrote: under load git may not
	// have written its whole request yet, and a kill then leaves a request
	// that never lands, with or without a cut.
	eventually(t, 60*time.Second, "the whole push queued in the kernel", func() bool { return proxy.allQueued(t) })

	events := func() string { b, _ := os.ReadFile(filepath.Join(cg, "cgroup.events")); return string(b) }
	os.WriteFile(filepath.Join(cg, "cgroup.freeze"), []byte("1"), 0)
	eventually(t, 10*time.Second, "the push frozen", func() bool { return strings.Contains(events(), "frozen 1") })
	sentAtFreeze := proxy.maxUp()
	os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0)
	eventually(t, 10*time.Second, "the push killed", func() bool { return strings.Contains(events(), "populated 0") })
	<-waited
	killed := time.Now()

	how := atkWaitSettled(t, proxy, srv)
	if got := srv.Ref("refs/heads/main"); got != commit {
		t.Fatalf("control: main is %s, want the killed push's %s: the queued bytes were not flushed, the control proves nothing", got, commit)
	}
	var landed time.Time
	for _, r := range srv.Pushes("bot") {
		if r.Tip == commit {
			landed = r.At
		}
	}
	t.Logf("control: %d bytes read at the freeze, %d in all; the client's side ended with %q; the push landed (request began %v before the kill; ref checked %v after it)",
		sentAtFreeze, proxy.maxUp(), how, killed.Sub(landed), time.Since(killed))
}

func atkRandom(t testing.TB, n int) []byte {
	b := make([]byte, n)
	f, err := os.Open("/dev/urandom")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatal(err)
	}
	return b
}

// atkScanEnv scans the environment and argv of every process of shim's
// pid namespace for the secrets; it returns the offending processes and
// how many of shim's own git-remote-http processes it saw.
func atkScanEnv(s *Shim, secrets []string) (found []string, fetchers int) {
	for pid := range s.PidnsProcs() {
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		argv, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		cmd := strings.ReplaceAll(string(argv), "\x00", " ")
		if strings.Contains(cmd, "remote-http") { // the git that talks HTTP: the Authorization header was in its environment
			fetchers++
		}
		for _, sec := range secrets {
			if strings.Contains(string(env), sec) {
				found = append(found, fmt.Sprintf("environ of %d (%s)", pid, cmd))
			}
			if strings.Contains(string(argv), sec) {
				found = append(found, fmt.Sprintf("argv of %d (%s)", pid, cmd))
			}
		}
	}
	return found, fetchers
}

// 7. Secrets in no process's environment or argv, shim's own git included:
// every process of shim's pid namespace scanned again and again during a
// fence with --fetch and a credential (the remote is slow, so the fetch is
// seen). Before the fix the fetching git carried Authorization: Basic
// base64(user:secret) in its environment.
func TestAttackSecretsDuringFetch(t *testing.T) {
	f := newWTFixture(t)
	pw := credSecret("fetch")
	srv := atkGitServer(t, gitServerOpts{Accounts: map[string]gitAccount{"bot": {Password: pw, Branch: "main"}}})
	proxy := startAtkSlowProxy(t, srv.HostPort, 16<<10, 300*time.Millisecond)
	url := "http://" + proxy.Addr + "/repo.git"
	hgit(t, f.wt, "push", "-q", "-f", srv.Bare, "main")
	hgit(t, f.wt, "remote", "set-url", "origin", url)
	chownR(t, f.wt, wtUID)
	a := newAtkRig(t, shimOpts{}, map[string]string{"protocol": "http", "host": proxy.Addr, "path": "repo.git", "username": "bot", "password": pw})
	secrets := []string{pw, base64.StdEncoding.EncodeToString([]byte("bot:" + pw))}

	g1 := a.script(f.bin, "gen1.sh", `
hammer
touch "$ATTACK_OUT/ready"
exec sleep 1000
`)
	var r1 api.StartResult
	a.s.MustCtl(&r1, f.startArgs(1, append(a.harnessArgs(), "--", g1)...)...)
	a.waitReady(1, 30*time.Second)

	stop := make(chan struct{})
	var scans, fetchers int
	var leaks []string
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		for {
			found, n := atkScanEnv(a.s, secrets)
			scans++
			fetchers += n
			leaks = append(leaks, found...)
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	x := a.announce(1, 120*time.Second, f.startArgs(2, "--fetch", "--credential-file", a.cf, "--", "sleep", "1000")...)
	close(stop)
	<-scanned
	a.checkGone(x, 1, r1.Cgroup, a.out)
	if x.code != 0 {
		t.Fatalf("announcing gen 2 with --fetch: exit %d %s", x.code, strings.TrimSpace(x.errs))
	}
	var r2 api.StartResult
	if err := json.Unmarshal([]byte(x.out), &r2); err != nil || len(r2.Fenced) != 1 {
		t.Fatalf("start 2: %q", x.out)
	}
	rep := r2.Fenced[0]
	if w := rep.Worktree; w == nil || w.Fetch == nil || w.Fetch.Error != "" || !w.Fetch.Authenticated {
		b, _ := json.Marshal(rep.Worktree)
		t.Errorf("the fetch at the fence did not authenticate: %s", b)
	}
	seen := map[string]bool{}
	for _, l := range leaks {
		if !seen[l] {
			seen[l] = true
			t.Errorf("secret in the %s", l)
		}
	}
	if fetchers == 0 {
		t.Errorf("%d scans saw no git-remote-http of shim's fetch: the scan proves nothing", scans)
	}
	t.Logf("%d scans during the fence (%v), shim's git-remote-http seen in %d of them; fence ms %v", scans, x.took, fetchers, rep.DurationsMS)
	a.checkServing()
	t.Logf("SIGTERM to exit: %v", a.stop())
	credScanForSecrets(t, secrets, map[string]string{"shim log": a.s.Log.String()}, a.rd, f.wt, a.out, a.home)
}
