package network

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/shimdev/shim/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The test binary has extra personalities, chosen by envTestMode, for the
// processes the tests start (inside a test cgroup, some inside a
// generation's namespace):
//
//	client  one CONNECT through the proxy at $SHIM_NET_TEST_PROXY to
//	        $SHIM_NET_TEST_TARGET, echo a line, print "ok"
//	sender  dial $SHIM_NET_TEST_ADDR, print "local <addr>", write
//	        $SHIM_NET_TEST_SIZE bytes (blocking); with $SHIM_NET_TEST_HOLD=1
//	        first force a send buffer that holds them all and print
//	        "written" once they are; with $SHIM_NET_TEST_CLOSE=1 the same,
//	        then close and print "closed"; then wait for stdin to close.
//	        With $SHIM_NET_TEST_MPTCP=1 it dials MPTCP (the sink listens
//	        MPTCP)
//	loop    listen on 127.0.0.1:0, connect to itself, open a connected UDP
//	        socket, print "ready <listen addr>", wait
//
// Otherwise it runs the tests. As root it first re-executes itself in a
// fresh network and mount namespace (envInner), so every namespace, veth,
// address and socket the tests create is private to this run: a second
// copy of the suite beside it sees none of them.
const (
	envTestMode = "SHIM_NET_TEST_MODE"
	envInner    = "SHIM_NET_TEST_INNER"
)

// inNamespace is true when the tests run in their private namespaces.
var inNamespace bool

func TestMain(m *testing.M) {
	switch os.Getenv(envTestMode) {
	case "client":
		os.Exit(clientMain())
	case "sender":
		os.Exit(senderMain())
	case "loop":
		os.Exit(loopMain())
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
		fmt.Fprintln(os.Stderr, "network tests: cannot enter private namespaces:", err)
		if testutil.Strict() {
			os.Exit(1)
		}
	}
	if os.Getenv(envInner) == "1" {
		if err := setupInner(); err != nil {
			fmt.Fprintln(os.Stderr, "network tests: namespace setup:", err)
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
	testutil.Need(t, os.Geteuid() == 0 && inNamespace, "needs root and private network namespaces")
}

func clientMain() int {
	c, err := net.DialTimeout("tcp", os.Getenv("SHIM_NET_TEST_PROXY"), 3*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br, err := connectTunnel(c, os.Getenv("SHIM_NET_TEST_TARGET"))
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

func senderMain() int {
	size, _ := strconv.Atoi(os.Getenv("SHIM_NET_TEST_SIZE"))
	closeAfter := os.Getenv("SHIM_NET_TEST_CLOSE") == "1"
	hold := closeAfter || os.Getenv("SHIM_NET_TEST_HOLD") == "1"
	var d net.Dialer
	d.SetMultipathTCP(os.Getenv("SHIM_NET_TEST_MPTCP") == "1")
	c, err := d.Dial("tcp", os.Getenv("SHIM_NET_TEST_ADDR"))
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	if hold {
		raw, _ := c.(*net.TCPConn).SyscallConn()
		_ = raw.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 4*size)
		})
		if err != nil {
			fmt.Println("SO_SNDBUFFORCE:", err)
			return 1
		}
	}
	fmt.Println("local", c.LocalAddr())
	if _, err := c.Write(make([]byte, size)); err != nil {
		fmt.Println("write:", err)
	}
	if closeAfter {
		c.Close() // the socket is now an orphan that the kernel keeps flushing
		fmt.Println("closed")
	} else if hold {
		fmt.Println("written")
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	// The socket must outlive the wait: unreachable, it would be closed by
	// the runtime's finalizer at the next collection.
	runtime.KeepAlive(c)
	return 0
}

func loopMain() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("listen:", err)
		return 1
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	s, err := ln.Accept()
	if err != nil {
		fmt.Println("accept:", err)
		return 1
	}
	_, _ = c.Write([]byte("hello"))
	u, err := net.Dial("udp", "127.0.0.1:9") // connected, nothing sent
	if err != nil {
		fmt.Println("udp:", err)
		return 1
	}
	defer u.Close()
	fmt.Println("ready", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	s.Close()
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

// The audit recorder, log sink and logger of the test kit.
type auditLog = testutil.AuditLog
type syncBuffer = testutil.SyncBuffer

func testLogger(w io.Writer) hclog.Logger { return testutil.Logger(w) }

// waitFor polls cond every 10 ms until it holds, failing the test after
// the deadline with what.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitStable polls f until it returns the same positive value 10 times in
// a row (100 ms), and returns it: a queue that has stopped moving.
func waitStable(t testing.TB, what string, f func() int64) int64 {
	t.Helper()
	var last int64 = -1
	same := 0
	waitFor(t, 15*time.Second, what+" to stop changing", func() bool {
		v := f()
		if v > 0 && v == last {
			same++
		} else {
			same = 0
		}
		last = v
		return same >= 10
	})
	return last
}
