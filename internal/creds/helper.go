package creds

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// EnvCredSock names the environment variable that tells `shim credential`
// where the broker's socket is.
const EnvCredSock = "SHIM_CRED_SOCK"

// HarnessEnv returns the environment entries that make git in the harness
// use the broker, and nothing else, for credentials:
//
//   - GIT_CONFIG_COUNT/KEY_n/VALUE_n (command-line scope, read last) reset
//     credential.helper to "" (dropping any helper from system or user
//     config, e.g. a credential store on disk) and then set it to
//     "!'<shimPath>' credential"; credential.useHttpPath=true so git sends
//     the repository path and path-scoped grants can match;
//   - SHIM_CRED_SOCK=<socketPath>;
//   - GIT_TERMINAL_PROMPT=0 and GIT_ASKPASS= (empty) so a refused request
//     fails instead of prompting.
//
// The entries never contain a secret. Put them after any user-supplied
// environment: they replace GIT_CONFIG_COUNT and GIT_CONFIG_KEY/VALUE_0..2.
func HarnessEnv(shimPath, socketPath string) []string {
	kv := [][2]string{
		{"credential.helper", ""},
		{"credential.helper", HelperCommand(shimPath)},
		{"credential.useHttpPath", "true"},
	}
	env := []string{"GIT_CONFIG_COUNT=" + strconv.Itoa(len(kv))}
	for i, e := range kv {
		env = append(env,
			fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, e[0]),
			fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, e[1]))
	}
	return append(env,
		EnvCredSock+"="+socketPath,
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=",
	)
}

// HelperCommand is the credential.helper value that runs `shim credential`
// (git runs "!cmd" helpers through the shell).
func HelperCommand(shimPath string) string { return "!" + shellQuote(shimPath) + " credential" }

// shellQuote quotes s for sh (git runs "!cmd" helpers through the shell).
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// HelperMain implements `shim credential get|store|erase`: git's
// credential-helper protocol on stdin/stdout, answered by the broker at
// $SHIM_CRED_SOCK. args are the words after "credential" (a leading
// "credential" is tolerated). store and erase are accepted and ignored: the
// supervisor owns credentials. A refused get prints nothing and exits 0, so
// git (with GIT_TERMINAL_PROMPT=0) fails to authenticate. It returns the
// process exit code: 0 ok or refused, 1 broker unreachable, 2 usage.
func HelperMain(args []string, stdin io.Reader, stdout, stderr io.Writer, env func(string) string) int {
	if len(args) > 0 && args[0] == "credential" {
		args = args[1:]
	}
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: shim credential get|store|erase")
		return 2
	}
	switch args[0] {
	case "store", "erase":
		_, _ = io.Copy(io.Discard, io.LimitReader(stdin, maxRequest))
		return 0
	case "get":
	default:
		// git ignores unknown actions of a helper; so do we.
		return 0
	}
	attrs, err := readGitAttrs(stdin)
	if err != nil {
		fmt.Fprintln(stderr, "shim credential: malformed input from git:", err)
		return 0
	}
	sock := env(EnvCredSock)
	if sock == "" {
		fmt.Fprintln(stderr, "shim credential: "+EnvCredSock+" is not set")
		return 1
	}
	reply, err := askBroker(sock, "get", attrs)
	if err != nil {
		fmt.Fprintln(stderr, "shim credential: broker unreachable:", err)
		return 1
	}
	if _, err := io.WriteString(stdout, reply); err != nil {
		return 1
	}
	return 0
}

// readGitAttrs reads git's key=value block (ended by an empty line or EOF),
// bounded, keeping only the attributes the broker matches on.
func readGitAttrs(r io.Reader) ([]string, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, maxRequest), 4096)
	var attrs []string
	for {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			return attrs, nil
		}
		if err != nil {
			return nil, err
		}
		if line == "" {
			return attrs, nil
		}
		// Forward only what the broker matches on: never a password git
		// may already hold, nor anything else the broker has no use for.
		k, _, _ := strings.Cut(line, "=")
		switch k {
		case "protocol", "host", "path", "username":
			attrs = append(attrs, line)
		}
	}
}

// askBroker sends one request and returns the validated reply block ("" when
// refused).
func askBroker(sock, action string, attrs []string) (string, error) {
	c, err := net.DialTimeout("unix", sock, brokerTimeout)
	if err != nil {
		return "", errors.New("cannot connect to credential socket")
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(brokerTimeout))
	var req strings.Builder
	req.WriteString(wireMagic + " " + action + "\n")
	for _, a := range attrs {
		req.WriteString(a + "\n")
	}
	req.WriteString("\n")
	if _, err := io.WriteString(c, req.String()); err != nil {
		return "", errors.New("cannot send request")
	}
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	br := bufio.NewReaderSize(io.LimitReader(c, maxRequest), 4096)
	var out strings.Builder
	for {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) || (err == nil && line == "") {
			break
		}
		if err != nil {
			return "", errors.New("malformed reply")
		}
		if !strings.Contains(line, "=") {
			return "", errors.New("malformed reply")
		}
		out.WriteString(line + "\n")
	}
	if out.Len() == 0 {
		return "", nil
	}
	return out.String() + "\n", nil
}
