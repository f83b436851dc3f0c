package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// ctlExecVerbs is the README's synopsis of the exec verbs
// (TestHelpListsTheREADMEsSynopsis).
const ctlExecVerbs = `  exec --generation N [--timeout D] [-i] [-t] [--env K=V]... [--cwd DIR] [--user U] [--label K=V]... [--detach] -- CMD [ARG...]
        (exits with CMD's code: 128+signal when killed, 124 when timed out)
  processes --generation N
  process --generation N ID
  attach --generation N [--stdout-offset B] [--stderr-offset B] [--no-follow] ID
  kill --generation N [--all] [--signal SIG] ID   (default TERM; --all: its whole tree)
`

// exitTimedOut is ctl exec's exit code for a call its timeout killed
// (coreutils timeout's).
const exitTimedOut = 124

// runCtlExec runs the exec verbs; ok is false for any other verb.
func runCtlExec(ctx context.Context, c *client.Client, verb string, args []string) (code int, ok bool) {
	switch verb {
	case "exec":
		return ctlExec(ctx, c, args), true
	case "processes":
		vf := newVerbFlags(verb)
		gen := vf.Uint64("generation", 0, "")
		if err := vf.Parse(args); err != nil || *gen == 0 {
			return usageError(orMissing(err, "--generation")), true
		}
		return emit(c.Processes(ctx, *gen)), true
	case "process":
		vf := newVerbFlags(verb)
		gen := vf.Uint64("generation", 0, "")
		if err := vf.Parse(args); err != nil || *gen == 0 || vf.NArg() != 1 {
			return usageError(orMissing(err, "--generation N and a process id")), true
		}
		return emit(c.Process(ctx, *gen, vf.Arg(0))), true
	case "attach":
		vf := newVerbFlags(verb)
		gen := vf.Uint64("generation", 0, "")
		out := &client.Output{Stdout: os.Stdout, Stderr: os.Stderr}
		vf.Int64Var(&out.StdoutOffset, "stdout-offset", 0, "")
		vf.Int64Var(&out.StderrOffset, "stderr-offset", 0, "")
		noFollow := vf.Bool("no-follow", false, "")
		if err := vf.Parse(args); err != nil || *gen == 0 || vf.NArg() != 1 {
			return usageError(orMissing(err, "--generation N and a process id")), true
		}
		rec, err := c.Attach(ctx, *gen, vf.Arg(0), out, !*noFollow)
		if err != nil || rec == nil {
			return emit(nil, err), true
		}
		return callExitCode(rec), true
	case "kill":
		vf := newVerbFlags(verb)
		gen := vf.Uint64("generation", 0, "")
		all := vf.Bool("all", false, "")
		sig := vf.String("signal", "TERM", "")
		if err := vf.Parse(args); err != nil || *gen == 0 || vf.NArg() != 1 {
			return usageError(orMissing(err, "--generation N and a process id")), true
		}
		return emit(nil, c.SignalProcess(ctx, *gen, vf.Arg(0), *sig, *all)), true
	}
	return 0, false
}

func newVerbFlags(verb string) *flag.FlagSet {
	vf := flag.NewFlagSet(verb, flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	return vf
}

// ctlExec runs a tool call and streams its output: stdout to stdout,
// stderr to stderr; with -i this process's stdin goes to the call's.
func ctlExec(ctx context.Context, c *client.Client, args []string) int {
	vf := newVerbFlags("exec")
	gen := vf.Uint64("generation", 0, "")
	timeout := vf.Duration("timeout", 0, "")
	interactive := vf.Bool("i", false, "")
	tty := vf.Bool("t", false, "")
	cwd := vf.String("cwd", "", "")
	user := vf.String("user", "", "")
	detach := vf.Bool("detach", false, "")
	var env, labels strList
	vf.Var(&env, "env", "")
	vf.Var(&labels, "label", "")
	if err := vf.Parse(args); err != nil || *gen == 0 {
		return usageError(orMissing(err, "--generation"))
	}
	if vf.NArg() == 0 {
		return usageError(errors.New("exec needs a command after --"))
	}
	req := api.ExecRequest{Command: vf.Args(), Env: env, Cwd: *cwd, User: *user, Stdin: *interactive, TTY: *tty,
		TimeoutMS: timeout.Milliseconds()}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return usageError(fmt.Errorf("--label %q is not K=V", l))
		}
		if req.Labels == nil {
			req.Labels = map[string]string{}
		}
		req.Labels[k] = v
	}
	if *tty {
		if ws, err := unix.IoctlGetWinsize(int(os.Stdout.Fd()), unix.TIOCGWINSZ); err == nil {
			req.Rows, req.Cols = ws.Row, ws.Col
		}
	}
	if *detach {
		return emit(c.ExecDetached(ctx, *gen, req))
	}
	out := &client.Output{Stdout: os.Stdout, Stderr: os.Stderr}
	if *interactive {
		out.Frame = func(f api.Frame) error {
			if f.Type == api.FrameStarted {
				go copyStdin(ctx, c, *gen, f.ID)
			}
			return nil
		}
	}
	rec, err := c.Exec(ctx, *gen, req, out)
	for tries := 0; client.CodeOf(err) == api.CodeStreamLost && out.ID != "" && tries < 3; tries++ {
		rec, err = c.Attach(ctx, *gen, out.ID, out, true)
	}
	if err != nil || rec == nil {
		return emit(nil, err)
	}
	if rec.Fenced {
		writeErr(api.CodeStaleGeneration, fmt.Sprintf("generation %d was fenced while tool call %s ran: it was killed with it", *gen, rec.ID), nil)
	}
	return callExitCode(rec)
}

// callExitCode is ctl exec's exit code for a call's final record.
func callExitCode(rec *api.Process) int {
	switch {
	case rec.TimedOut:
		return exitTimedOut
	case rec.ExitCode != nil:
		return *rec.ExitCode
	}
	return exitError
}

// copyStdin sends this process's stdin to call id's, then closes it.
func copyStdin(ctx context.Context, c *client.Client, gen uint64, id string) {
	buf := make([]byte, 32<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			for data := buf[:n]; len(data) > 0; {
				w, werr := c.WriteStdin(ctx, gen, id, data)
				data = data[w:]
				if werr != nil && client.CodeOf(werr) != api.CodeStdinFull {
					return
				}
			}
		}
		if err != nil {
			c.CloseStdin(ctx, gen, id)
			return
		}
	}
}
