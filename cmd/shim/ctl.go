package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
	"github.com/shimdev/shim/internal/creds"
)

// Exit codes of shim ctl (the contract).
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitStale       = 3 // stale or conflicting generation
	exitFenceFailed = 4 // fail-closed
	exitUnreachable = 5
)

const ctlUsage = "usage: shim ctl [--runtime-dir DIR] VERB ...\n" + ctlVerbs + ctlExecVerbs

// ctlVerbs is the README's synopsis of shim ctl's verbs
// (TestHelpListsTheREADMEsSynopsis).
const ctlVerbs = `  status
  start --generation N [--cwd DIR] [--user UID[:GID]]
        [--env K=V]... [--worktree DIR [--baseline REV] [--branch NAME] [--keep-path P]... [--include-ignored]
        [--fetch] [--fetch-remote NAME] [--fetch-branch NAME] [--fetch-settle D] [--fetch-url URL] [--fetch-continue]] [--linger]
        [--network host|none|isolated]
        [--allow HOST[:PORT]]... [--credential-file FILE] [--label K=V]...
        [--memory-max BYTES] [--pids-max N] [--cpu-max "QUOTA PERIOD"]
        [--require-isolation] [--if-current M] [--lease D] [--idle | -- CMD [ARG...]]
        (no command, or --idle: a generation without a harness, for tool calls)
  fence --generation N [--worktree DIR [--baseline REV] [--keep-path P]...
        [--include-ignored] [--fetch] [--fetch-remote NAME] [--fetch-branch NAME] [--fetch-settle D]
        [--fetch-url URL] [--credential-file FILE]] [--if-current M]
  end --generation N [--if-current M] [--force]   (fence N itself, start nothing; N never announced: --force)
  renew --generation N [--lease D]      (renew its lease; a suspended N resumes)
  register --worktree DIR [--keep-path P]... [--include-ignored]
  signal --generation N [--all] SIGNAL
  wait --generation N [--timeout D]
  generation --generation N
  generations [--label K=V]...   (the kept records)
  events [--since SEQ [--instance ID]]   (a gap event says what a reader missed)
  logs [-f] --generation N [--stdout-offset B] [--stderr-offset B] [--frames]
  snapshots [--worktree DIR]
  snapshot --generation N [--worktree DIR]
`

// nested puts two more spaces before every line of s.
func nested(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n  ") + "\n"
}

type strList []string

func (l *strList) String() string     { return strings.Join(*l, ",") }
func (l *strList) Set(s string) error { *l = append(*l, s); return nil }

// runCtl is a thin client of the control API: it prints the JSON answer
// and maps error codes to the contract's exit codes.
func runCtl(args []string) int {
	fs := flag.NewFlagSet("ctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	runtimeDir := fs.String("runtime-dir", defaultRuntimeDir(), "runtime dir of the shim")
	connect := fs.String("connect", "", "reach the shim at vsock:CID:PORT, vsock-uds:PATH:PORT, serial:PATH or unix:PATH instead (docs/microvm.md)")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(ctlUsage)
			return exitOK
		}
		return usageError(err)
	}
	c := client.New(*runtimeDir)
	if *connect != "" {
		var err error
		if c, err = client.Connect(*connect); err != nil {
			return emit(nil, err) // BAD_REQUEST: exit 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	verb, rest := fs.Arg(0), fs.Args()[1:]
	switch verb {
	case "help", "-h", "--help":
		fmt.Print(ctlUsage)
		return exitOK
	case "events":
		return runCtlEvents(ctx, c, rest)
	case "logs":
		return runCtlLogs(ctx, c, rest)
	}
	if fn, ok := ctlVerbFuncs[verb]; ok {
		return fn(ctx, c, verb, rest)
	}
	if code, ok := runCtlExec(ctx, c, verb, rest); ok {
		return code
	}
	return usageError(fmt.Errorf("unknown verb %q", verb))
}

func parseStart(args []string) (api.StartRequest, error) {
	var req api.StartRequest
	fs := flag.NewFlagSet("start", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Uint64Var(&req.Generation, "generation", 0, "")
	fs.StringVar(&req.Cwd, "cwd", "", "")
	fs.StringVar(&req.User, "user", "", "")
	fs.StringVar(&req.Worktree, "worktree", "", "")
	fs.StringVar(&req.Baseline, "baseline", "", "")
	fs.StringVar(&req.Branch, "branch", "", "")
	fs.StringVar(&req.Network, "network", "", "")
	credFile := fs.String("credential-file", "", "")
	fs.BoolVar(&req.IncludeIgnored, "include-ignored", false, "")
	fs.BoolVar(&req.Linger, "linger", false, "")
	fs.BoolVar(&req.Idle, "idle", false, "")
	fs.BoolVar(&req.RequireIsolation, "require-isolation", false, "")
	fs.Var(optUint{&req.IfCurrent}, "if-current", "")
	lease := fs.Duration("lease", 0, "")
	var env, allow, labels, keep strList
	fs.Var(&keep, "keep-path", "")
	fs.Var(&env, "env", "")
	fs.Var(&allow, "allow", "")
	fs.Var(&labels, "label", "")
	var limits api.Limits
	fetch := fetchFlags(fs)
	fs.Int64Var(&limits.MemoryMax, "memory-max", 0, "")
	fs.Int64Var(&limits.PidsMax, "pids-max", 0, "")
	fs.StringVar(&limits.CPUMax, "cpu-max", "", "")
	if err := fs.Parse(args); err != nil {
		return req, err
	}
	if req.Generation == 0 {
		return req, errors.New("start needs --generation N (N > 0)")
	}
	if fs.NArg() > 0 && req.Idle {
		return req, errors.New("start --idle takes no command")
	}
	req.Command = fs.Args() // none: an idle generation, for tool calls
	req.LeaseMS = lease.Milliseconds()
	req.Env, req.Allow, req.KeepPaths = env, allow, keep
	req.Fetch = fetch.spec()
	if limits != (api.Limits{}) {
		req.Limits = &limits
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return req, fmt.Errorf("--label %q is not K=V", l)
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[k] = v
	}
	var err error
	req.Credentials, err = readCredentialFile(*credFile)
	return req, err
}

// readCredentialFile reads --credential-file ("" is none). It is read here
// and sent in the request: the file is never copied.
func readCredentialFile(path string) ([]api.Credential, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--credential-file: %v", err)
	}
	list, err := creds.ParseCredentials(b)
	if err != nil {
		return nil, fmt.Errorf("--credential-file: %v", err)
	}
	var out []api.Credential
	for _, c := range list {
		out = append(out, api.Credential{Protocol: c.Protocol, Host: c.Host, Path: c.Path, Username: c.Username, Password: c.Password})
	}
	return out, nil
}

// fetchOpts are --fetch, --fetch-remote and --fetch-branch; either name
// implies --fetch.
type fetchOpts struct {
	on, cont       *bool
	remote, branch *string
	settle         *time.Duration
	url            *string
}

func fetchFlags(fs *flag.FlagSet) fetchOpts {
	return fetchOpts{
		on:     fs.Bool("fetch", false, ""),
		remote: fs.String("fetch-remote", "", ""),
		branch: fs.String("fetch-branch", "", ""),
		settle: fs.Duration("fetch-settle", 0, ""),
		url:    fs.String("fetch-url", "", ""),
		cont:   fs.Bool("fetch-continue", false, ""),
	}
}

func (f fetchOpts) spec() *api.FetchSpec {
	if !*f.on && *f.remote == "" && *f.branch == "" && *f.settle == 0 && *f.url == "" && !*f.cont {
		return nil
	}
	return &api.FetchSpec{Remote: *f.remote, Branch: *f.branch, SettleMS: f.settle.Milliseconds(), RemoteURL: *f.url, Continue: *f.cont}
}

func orMissing(err error, what string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("missing %s", what)
}

func usageError(err error) int {
	msg := "missing verb"
	if err != nil {
		msg = err.Error()
	}
	writeErr(api.CodeBadRequest, msg+" (see: shim ctl help)", nil)
	return exitUsage
}

func writeErr(code, msg string, fenced []api.FenceReport) {
	b, _ := json.Marshal(client.Error{Code: code, Message: msg, Fenced: fenced})
	fmt.Fprintln(os.Stderr, string(b))
}

// emit writes v as JSON on success, or the error as JSON on stderr, and
// returns the exit code of the contract.
func emit(v any, err error) int {
	if err != nil {
		var ce *client.Error
		if !errors.As(err, &ce) {
			ce = &client.Error{Code: api.CodeOf(err), Message: err.Error()}
		}
		writeErr(ce.Code, ce.Message, ce.Fenced)
		return exitCodeOf(ce.Code)
	}
	if v != nil {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(v)
	}
	return exitOK
}

func exitCodeOf(code string) int {
	switch code {
	case api.CodeStaleGeneration, api.CodeGenerationConflict, api.CodeNotCurrent, api.CodeNotAnnounced:
		return exitStale
	case api.CodeFenceFailed, api.CodeCutFailed, api.CodeRestoreFailed, api.CodeTokenNotPersisted, api.CodeAuditFailed:
		return exitFenceFailed
	case api.CodeUnreachable:
		return exitUnreachable
	case api.CodeBadRequest, api.CodeMethodNotAllowed:
		return exitUsage
	}
	return exitError
}

// optUint is an optional unsigned flag (--if-current N): it sets *p to
// the value once given, leaves it nil otherwise.
type optUint struct{ p **uint64 }

func (o optUint) String() string {
	if o.p == nil || *o.p == nil {
		return ""
	}
	return strconv.FormatUint(**o.p, 10)
}

func (o optUint) Set(v string) error {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return err
	}
	*o.p = &n
	return nil
}
