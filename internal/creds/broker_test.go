package creds

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const testSecret = "ghp_s3cr3t-DO-NOT-LEAK-7f3a9c"

// TestCredentialNeverFormatsSecret: every fmt verb, JSON, hclog and errors
// show the credential without its password.
func TestCredentialNeverFormatsSecret(t *testing.T) {
	c := Credential{Protocol: "https", Host: "github.com", Path: "org/repo", Username: "x-access-token", Password: testSecret}
	var out bytes.Buffer
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T %v"} {
		fmt.Fprintf(&out, verb+"\n", c)
		fmt.Fprintf(&out, verb+"\n", &c)
		fmt.Fprintf(&out, verb+"\n", []Credential{c})
		fmt.Fprintf(&out, verb+"\n", map[string]Credential{"a": c})
	}
	j, err := json.Marshal(map[string]any{"c": c, "list": []Credential{c}, "p": &c})
	if err != nil {
		t.Fatal(err)
	}
	out.Write(j)
	var logs syncBuffer
	testLogger(&logs).Info("credential", "c", c, "list", []Credential{c})
	// A bad credential's validation error must not quote it either.
	bad := c
	bad.Host = "a/b"
	errText := fmt.Sprint(bad.Validate())
	if _, err := ParseCredentials([]byte(`[{"protocol":"https","host":"x","token":"` + testSecret + `","username":1}]`)); err != nil {
		errText += err.Error()
	} else {
		t.Error("a numeric username was accepted")
	}
	assertNoSecret(t, testSecret, map[string][]byte{"fmt": out.Bytes(), "logs": logs.Bytes(), "errors": []byte(errText)})
	if !strings.Contains(out.String(), "x-access-token:[REDACTED]@github.com/org/repo") {
		t.Errorf("redacted form lacks the description:\n%s", out.String())
	}
}

// TestParseCredentials: "token" is an alias of "password"; what is not a
// credential is refused.
func TestParseCredentials(t *testing.T) {
	in := `[{"protocol":"HTTPS","host":"GitHub.com","path":"/org/","username":"u","token":"` + testSecret + `"},
	        {"protocol":"http","host":"127.0.0.1:8080","username":"v","password":"p2"}]`
	list, err := ParseCredentials([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Password != testSecret || list[0].Host != "github.com" || list[0].Protocol != "https" || list[0].Path != "org" || list[1].Password != "p2" {
		t.Fatalf("parsed wrongly: %v", list)
	}
	for _, bad := range []string{`{}`, `[{"protocol":"https","host":"h","username":"u"}]`, `[{"host":"h","password":"p"}]`,
		`[{"protocol":"https","host":"h","password":"a","token":"b"}]`, `[{"protocol":"https","host":"h","password":"a\nb"}]`} {
		if _, err := ParseCredentials([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestCredentialMatch: protocol and host exact (case-insensitive), path
// prefix on segment boundaries, username when git names one.
func TestCredentialMatch(t *testing.T) {
	c := Credential{Protocol: "https", Host: "github.com", Path: "org/repo", Username: "u", Password: "p"}
	for _, tc := range []struct {
		proto, host, path, user string
		want                    bool
	}{
		{"https", "github.com", "org/repo", "", true},
		{"https", "GITHUB.com", "org/repo.git", "", true},
		{"https", "github.com", "/org/repo/info/refs", "u", true},
		{"https", "github.com", "org/repo-other", "", false},
		{"https", "github.com", "org", "", false},
		{"https", "github.com", "", "", false},
		{"http", "github.com", "org/repo", "", false},
		{"https", "github.com:443", "org/repo", "", false},
		{"https", "github.com", "org/repo", "someone-else", false},
	} {
		if got := c.matches(tc.proto, tc.host, tc.path, tc.user); got != tc.want {
			t.Errorf("matches(%q,%q,%q,%q) = %v", tc.proto, tc.host, tc.path, tc.user, got)
		}
	}
	any := Credential{Protocol: "https", Host: "github.com", Username: "u", Password: "p"}
	if !any.matches("https", "github.com", "", "") || !any.matches("https", "github.com", "x/y", "") {
		t.Error("a credential without path must match any path")
	}
}

// TestHarnessEnv: git is pointed at the helper, prompts are off, and the
// value quotes a path with spaces and quotes for sh.
func TestHarnessEnv(t *testing.T) {
	env := HarnessEnv("/opt/my shim/it's", "/run/shim/cred.sock")
	want := []string{
		"GIT_CONFIG_COUNT=3",
		"GIT_CONFIG_KEY_0=credential.helper", "GIT_CONFIG_VALUE_0=",
		"GIT_CONFIG_KEY_1=credential.helper", `GIT_CONFIG_VALUE_1=!'/opt/my shim/it'\''s' credential`,
		"GIT_CONFIG_KEY_2=credential.useHttpPath", "GIT_CONFIG_VALUE_2=true",
		"SHIM_CRED_SOCK=/run/shim/cred.sock", "GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=",
	}
	if strings.Join(env, "\n") != strings.Join(want, "\n") {
		t.Fatalf("HarnessEnv:\n%s\nwant:\n%s", strings.Join(env, "\n"), strings.Join(want, "\n"))
	}
}

// brokerFixture starts a broker whose Identify answers from a function the
// test controls.
type brokerFixture struct {
	b     *Broker
	sock  string
	audit *auditLog
	logs  *syncBuffer
	ident atomic.Value // func(pid int) (uint64, bool, error)
}

func newBrokerFixture(t testing.TB) *brokerFixture {
	t.Helper()
	f := &brokerFixture{audit: &auditLog{}, logs: &syncBuffer{}}
	f.sock = filepath.Join(t.TempDir(), "cred.sock")
	f.ident.Store(func(int) (uint64, bool, error) { return 0, false, errors.New("unknown") })
	b, err := NewBroker(f.sock, func(pid int) (uint64, bool, error) {
		return f.ident.Load().(func(int) (uint64, bool, error))(pid)
	}, f.audit.Record, testLogger(f.logs))
	if err != nil {
		t.Fatal(err)
	}
	f.b = b
	done := make(chan error, 1)
	go func() { done <- b.Serve() }()
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("broker close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return f
}

func (f *brokerFixture) setIdentity(gen uint64, current bool) {
	self := os.Getpid()
	f.ident.Store(func(pid int) (uint64, bool, error) {
		if pid != self {
			return 0, false, errors.New("not a harness process")
		}
		return gen, current, nil
	})
}

// get runs HelperMain in-process (this process is the SO_PEERCRED peer).
func (f *brokerFixture) get(t testing.TB, input string) (string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := HelperMain([]string{"get"}, strings.NewReader(input), &out, &errOut, func(k string) string {
		if k == EnvCredSock {
			return f.sock
		}
		return ""
	})
	return out.String(), code
}

// TestBrokerDecisions: only the current generation with a matching grant
// gets a credential; every other case gets an empty answer and an audit
// record with the reason; nothing leaks the secret.
func TestBrokerDecisions(t *testing.T) {
	f := newBrokerFixture(t)
	fi, err := os.Stat(f.sock)
	if err != nil || fi.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	f.b.Grant(7, []Credential{
		{Protocol: "https", Host: "github.com", Username: "bot", Password: testSecret},
		{Protocol: "https", Host: "git.example", Path: "team/app", Username: "scoped", Password: testSecret + "-scoped"},
	})
	req := "protocol=https\nhost=github.com\npath=org/repo.git\n\n"

	f.setIdentity(7, true)
	out, code := f.get(t, req)
	if code != 0 || !strings.Contains(out, "username=bot\n") || !strings.Contains(out, "password="+testSecret+"\n") {
		t.Fatalf("current generation: code %d, answer has credential: %v", code, strings.Contains(out, testSecret))
	}
	if out2, _ := f.get(t, "protocol=https\nhost=git.example\npath=team/app.git\n"); !strings.Contains(out2, "username=scoped") {
		t.Error("path-scoped credential not answered for its path")
	}

	cases := []struct {
		name, input, reason string
		setup               func()
	}{
		{"path prefix mismatch", "protocol=https\nhost=git.example\npath=team/other.git\n\n", "no_matching_credential", func() { f.setIdentity(7, true) }},
		{"no path for scoped", "protocol=https\nhost=git.example\n\n", "no_matching_credential", func() { f.setIdentity(7, true) }},
		{"other host", "protocol=https\nhost=gitlab.com\n\n", "no_matching_credential", func() { f.setIdentity(7, true) }},
		{"other protocol", "protocol=http\nhost=github.com\n\n", "no_matching_credential", func() { f.setIdentity(7, true) }},
		{"not current", req, "not_current_generation", func() { f.setIdentity(7, false) }},
		{"other generation", req, "no_grant", func() { f.setIdentity(8, true) }},
		{"outside any generation", req, "not_a_generation", func() {
			f.ident.Store(func(int) (uint64, bool, error) { return 0, false, errors.New("no") })
		}},
	}
	for _, tc := range cases {
		tc.setup()
		before := len(f.audit.Find(EventCredentialRefused))
		out, code := f.get(t, tc.input)
		if out != "" || code != 0 {
			t.Errorf("%s: got answer %v (code %d), want nothing", tc.name, out != "", code)
		}
		refused := f.audit.Find(EventCredentialRefused)
		if len(refused) != before+1 || refused[len(refused)-1]["reason"] != tc.reason {
			t.Errorf("%s: audit %v, want reason %s", tc.name, refused[len(refused)-1:], tc.reason)
		}
	}

	f.setIdentity(7, true)
	// A lease that ran out suspends: refused, grants kept; Resume answers again.
	if n := f.b.Suspend(7); n != 2 {
		t.Errorf("Suspend reported %d, want 2", n)
	}
	if out, _ := f.get(t, req); out != "" {
		t.Error("suspended generation still answered")
	}
	if r := f.audit.Find(EventCredentialRefused); r[len(r)-1]["reason"] != "suspended" {
		t.Errorf("suspended: reason %v", r[len(r)-1]["reason"])
	}
	f.b.Resume(7)
	if out, _ := f.get(t, req); !strings.Contains(out, "username=bot\n") {
		t.Error("resumed generation not answered")
	}
	f.b.Suspend(7)
	if n := f.b.Revoke(7); n != 2 {
		t.Errorf("Revoke dropped %d, want 2", n)
	}
	if out, _ := f.get(t, req); out != "" {
		t.Error("revoked generation still answered")
	}
	if r := f.audit.Find(EventCredentialRefused); r[len(r)-1]["reason"] != "revoked" {
		t.Errorf("revoked: reason %v", r[len(r)-1]["reason"])
	}
	f.b.Grant(7, []Credential{{Protocol: "https", Host: "github.com", Username: "bot", Password: "again"}})
	f.b.Resume(7)
	if out, _ := f.get(t, req); out != "" {
		t.Error("a revoked generation was granted again")
	}

	granted := f.audit.Find(EventCredentialGranted)
	if len(granted) != 3 || granted[0]["generation"] != float64(7) || granted[0]["username"] != "bot" || granted[0]["host"] != "github.com" || granted[0]["pid"] != float64(os.Getpid()) {
		t.Errorf("granted audit: %v", granted)
	}
	// store/erase are accepted and ignored without contacting the broker.
	for _, action := range []string{"store", "erase"} {
		var o bytes.Buffer
		if code := HelperMain([]string{"credential", action}, strings.NewReader("protocol=https\nhost=github.com\npassword=x\n\n"), &o, &o, func(string) string { return "/nonexistent" }); code != 0 || o.Len() != 0 {
			t.Errorf("%s: code %d output %q", action, code, o.String())
		}
	}
	var e bytes.Buffer
	if code := HelperMain([]string{"get"}, strings.NewReader(req), &e, &e, func(string) string { return filepath.Join(t.TempDir(), "none.sock") }); code != 1 {
		t.Errorf("unreachable broker: code %d", code)
	}
	assertNoSecret(t, testSecret, map[string][]byte{"audit": f.audit.Bytes(), "logs": f.logs.Bytes(), "stderr": e.Bytes()}, filepath.Dir(f.sock))
}

// TestBrokerSurvivesGarbage: bad headers, binary junk, oversized requests,
// half-open and silent clients never crash the broker nor get an answer,
// and it keeps serving.
func TestBrokerSurvivesGarbage(t *testing.T) {
	f := newBrokerFixture(t)
	f.b.Grant(1, []Credential{{Protocol: "https", Host: "h", Username: "u", Password: testSecret}})
	f.setIdentity(1, true)
	big := wireMagic + " get\nhost=" + strings.Repeat("a", 2*maxRequest) + "\n\n"
	for i, junk := range []string{"", "\x00\x01\x02", "GET / HTTP/1.1\r\n\r\n", "shim-credential/1 get\nprotocol=https\nhost=h\x00\n\n",
		"shim-credential/1 store\nprotocol=https\nhost=h\n\n", "shim-credential/1 get\nnoequals\n\n", big} {
		c, err := net.Dial("unix", f.sock)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte(junk))
		_ = c.(*net.UnixConn).CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		var got bytes.Buffer
		_, _ = got.ReadFrom(c)
		c.Close()
		if got.Len() != 0 {
			t.Errorf("junk %d got an answer", i)
		}
	}
	// A silent client holds one handler only until the deadline; others
	// are served meanwhile.
	silent, err := net.Dial("unix", f.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if out, _ := f.get(t, "protocol=https\nhost=h\n\n"); !strings.Contains(out, "username=u") {
		t.Error("broker stopped serving after garbage")
	}
}
