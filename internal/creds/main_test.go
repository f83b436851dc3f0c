package creds

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The test binary has three extra personalities, chosen by envTestMode:
// "helper" is `shim credential` (git runs it as its credential helper),
// "client" makes one CONNECT through the proxy (run inside a generation's
// namespace through Network.Run), and otherwise it runs the tests. As root it
// first re-executes itself in a fresh network and mount namespace (envInner)
// so every namespace, veth and address the tests create disappears with it.
const (
	envTestMode = "SHIM_CREDS_TEST_MODE"
	envInner    = "SHIM_CREDS_TEST_INNER"
	envRequire  = "SHIM_REQUIRE_INTEGRATION"
)

// inNamespace is true when the tests run in their private namespaces.
var inNamespace bool

func TestMain(m *testing.M) {
	switch os.Getenv(envTestMode) {
	case "helper":
		os.Exit(HelperMain(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv))
	case "client":
		os.Exit(clientMain())
	}
	if os.Geteuid() == 0 && os.Getenv(envInner) == "" {
		cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
		cmd.Env = append(os.Environ(), envInner+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS,
			Pdeathsig:  syscall.SIGKILL,
		}
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
		if err == nil {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "creds tests: cannot enter private namespaces:", err)
		if os.Getenv(envRequire) == "1" {
			os.Exit(1)
		}
	}
	if os.Getenv(envInner) == "1" {
		if err := setupInner(); err != nil {
			fmt.Fprintln(os.Stderr, "creds tests: namespace setup:", err)
			os.Exit(1)
		}
		inNamespace = true
	}
	os.Exit(m.Run())
}

// setupInner makes mounts private and brings lo up in the test's namespace.
func setupInner() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	return linkUp(h, "lo")
}

// requireNetns skips (or fails under SHIM_REQUIRE_INTEGRATION=1) when the
// tests cannot run as root in private namespaces.
func requireNetns(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 && inNamespace {
		return
	}
	if os.Getenv(envRequire) == "1" {
		t.Fatal("integration test needs root and private namespaces (SHIM_REQUIRE_INTEGRATION=1)")
	}
	t.Skip("needs root and private network namespaces")
}

// requireTool skips (or fails) when a program is missing.
func requireTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(envRequire) == "1" {
			t.Fatalf("%s not found", name)
		}
		t.Skipf("%s not found", name)
	}
	return p
}

// clientMain: CONNECT to $SHIM_CREDS_TEST_TARGET through the proxy at
// $SHIM_CREDS_TEST_PROXY, send a line and expect it echoed. Prints "ok" or
// the failure; exit 0 only on success.
func clientMain() int {
	c, err := net.DialTimeout("tcp", os.Getenv("SHIM_CREDS_TEST_PROXY"), 3*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br, err := connectTunnel(c, os.Getenv("SHIM_CREDS_TEST_TARGET"))
	if err != nil {
		fmt.Println("connect:", err)
		return 1
	}
	fmt.Fprintf(c, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "ping\n" {
		fmt.Println("echo:", line, err)
		return 1
	}
	fmt.Println("ok")
	return 0
}

// connectTunnel sends CONNECT target on c and reads the proxy's answer.
func connectTunnel(c net.Conn, target string) (*bufio.Reader, error) {
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	status, err := br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		if l == "\r\n" {
			break
		}
	}
	if !strings.HasPrefix(status, "HTTP/1.1 200") {
		return nil, fmt.Errorf("proxy said %q", strings.TrimSpace(status))
	}
	return br, nil
}

// auditLog collects audit records (as JSON, as the runtime would write them).
type auditLog struct {
	mu   sync.Mutex
	recs []map[string]any
	raw  bytes.Buffer
}

func (a *auditLog) fn(event string, fields map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := map[string]any{"event": event}
	for k, v := range fields {
		rec[k] = v
	}
	b, _ := json.Marshal(rec)
	a.raw.Write(append(b, '\n'))
	var back map[string]any
	_ = json.Unmarshal(b, &back)
	a.recs = append(a.recs, back)
}

// find returns the records of event.
func (a *auditLog) find(event string) []map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []map[string]any
	for _, r := range a.recs {
		if r["event"] == event {
			out = append(out, r)
		}
	}
	return out
}

func (a *auditLog) bytes() []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]byte(nil), a.raw.Bytes()...)
}

// syncBuffer is a goroutine-safe log sink.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) Bytes() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b.Bytes()...)
}

func testLogger(w io.Writer) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "test", Output: w, Level: hclog.Trace})
}

// assertNoSecret fails when secret occurs in any blob or in any file under
// dirs.
func assertNoSecret(t *testing.T, secret string, blobs map[string][]byte, dirs ...string) {
	t.Helper()
	for name, b := range blobs {
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("secret found in %s", name)
		}
	}
	scanned := 0
	for _, d := range dirs {
		_ = filepath.Walk(d, func(p string, fi os.FileInfo, err error) error {
			if err != nil || !fi.Mode().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			scanned++
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("secret found in file %s", p)
			}
			return nil
		})
	}
	t.Logf("secret scan: %d blobs, %d files: clean unless reported", len(blobs), scanned)
}
