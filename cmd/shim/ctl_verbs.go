package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// The ctl verbs, one function each (runc's one file per command, in one
// file here): each parses its own flags and prints what shim answered.

// ctlVerbFuncs maps a verb to its function (events, logs and the exec verbs
// have their own files).
var ctlVerbFuncs = map[string]func(ctx context.Context, c *client.Client, verb string, rest []string) int{
	"status":      ctlStatus,
	"start":       ctlStart,
	"generations": ctlGenerations,
	"end":         ctlEnd,
	"renew":       ctlRenew,
	"fence":       ctlFence,
	"register":    ctlRegister,
	"signal":      ctlSignal,
	"wait":        ctlWait,
	"generation":  ctlWait,
	"snapshots":   ctlSnapshots,
	"snapshot":    ctlSnapshots,
}

func ctlStatus(ctx context.Context, c *client.Client, verb string, rest []string) int {
	return emit(c.Status(ctx))
}

func ctlStart(ctx context.Context, c *client.Client, verb string, rest []string) int {
	req, err := parseStart(rest)
	if err != nil {
		return usageError(err)
	}
	return emit(c.Start(ctx, req))
}

func ctlGenerations(ctx context.Context, c *client.Client, verb string, rest []string) int {
	vf := flag.NewFlagSet("generations", flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	var labels strList
	vf.Var(&labels, "label", "")
	if err := vf.Parse(rest); err != nil {
		return usageError(err)
	}
	m := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return usageError(fmt.Errorf("--label %q is not K=V", l))
		}
		m[k] = v
	}
	return emit(c.Generations(ctx, m))
}

func ctlEnd(ctx context.Context, c *client.Client, verb string, rest []string) int {
	vf := flag.NewFlagSet("end", flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	gen := vf.Uint64("generation", 0, "")
	force := vf.Bool("force", false, "")
	var ifCurrent *uint64
	vf.Var(optUint{&ifCurrent}, "if-current", "")
	if err := vf.Parse(rest); err != nil || *gen == 0 {
		return usageError(orMissing(err, "--generation"))
	}
	return emit(c.End(ctx, *gen, api.EndRequest{IfCurrent: ifCurrent, Force: *force}))
}

func ctlRenew(ctx context.Context, c *client.Client, verb string, rest []string) int {
	vf := flag.NewFlagSet("renew", flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	gen := vf.Uint64("generation", 0, "")
	lease := vf.Duration("lease", 0, "")
	if err := vf.Parse(rest); err != nil || *gen == 0 {
		return usageError(orMissing(err, "--generation"))
	}
	return emit(c.Renew(ctx, *gen, *lease))
}

func ctlFence(ctx context.Context, c *client.Client, verb string, rest []string) int {
	vf := flag.NewFlagSet("fence", flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	gen := vf.Uint64("generation", 0, "")
	wt := vf.String("worktree", "", "")
	base := vf.String("baseline", "", "")
	ignored := vf.Bool("include-ignored", false, "")
	var keep strList
	vf.Var(&keep, "keep-path", "")
	fetch := fetchFlags(vf)
	credFile := vf.String("credential-file", "", "")
	var ifCurrent *uint64
	vf.Var(optUint{&ifCurrent}, "if-current", "")
	if err := vf.Parse(rest); err != nil || *gen == 0 {
		return usageError(orMissing(err, "--generation"))
	}
	req := api.FenceRequest{Generation: *gen, Worktree: *wt, Baseline: *base, KeepPaths: keep, IncludeIgnored: *ignored, Fetch: fetch.spec(),
		IfCurrent: ifCurrent}
	var err error
	if req.Credentials, err = readCredentialFile(*credFile); err != nil {
		return usageError(err)
	}
	return emit(c.Fence(ctx, req))
}

func ctlRegister(ctx context.Context, c *client.Client, verb string, rest []string) int {
	vf := flag.NewFlagSet("register", flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	wt := vf.String("worktree", "", "")
	ignored := vf.Bool("include-ignored", false, "")
	var keep strList
	vf.Var(&keep, "keep-path", "")
	if err := vf.Parse(rest); err != nil || *wt == "" {
		return usageError(orMissing(err, "--worktree"))
	}
	return emit(c.Register(ctx, api.RegisterRequest{Worktree: *wt, KeepPaths: keep, IncludeIgnored: *ignored}))
}

func ctlSignal(ctx context.Context, c *client.Client, verb string, rest []string) int {
	vf := flag.NewFlagSet("signal", flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	gen := vf.Uint64("generation", 0, "")
	all := vf.Bool("all", false, "")
	if err := vf.Parse(rest); err != nil || *gen == 0 || vf.NArg() != 1 {
		return usageError(orMissing(err, "--generation and one SIGNAL"))
	}
	err := c.Signal(ctx, *gen, vf.Arg(0), *all)
	return emit(map[string]any{"generation": *gen, "signal": vf.Arg(0)}, err)
}

func ctlWait(ctx context.Context, c *client.Client, verb string, rest []string) int {
	vf := flag.NewFlagSet(verb, flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	gen := vf.Uint64("generation", 0, "")
	timeout := vf.Duration("timeout", 0, "")
	if err := vf.Parse(rest); err != nil || *gen == 0 {
		return usageError(orMissing(err, "--generation"))
	}
	if verb == "generation" {
		return emit(c.Generation(ctx, *gen))
	}
	wctx := ctx
	if *timeout > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	exit, err := c.Wait(wctx, *gen)
	if err != nil && *timeout > 0 && errors.Is(err, context.DeadlineExceeded) {
		err = &client.Error{Code: api.CodeWaitTimeout, Message: fmt.Sprintf("generation %d has not exited within %v", *gen, *timeout)}
	}
	if code := emit(exit, err); err != nil {
		return code
	}
	return exit.ExitCode
}

func ctlSnapshots(ctx context.Context, c *client.Client, verb string, rest []string) int {
	vf := flag.NewFlagSet(verb, flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	gen := vf.Uint64("generation", 0, "")
	wt := vf.String("worktree", "", "")
	if err := vf.Parse(rest); err != nil || verb == "snapshot" && *gen == 0 {
		return usageError(orMissing(err, "--generation"))
	}
	if verb == "snapshots" {
		return emit(c.Snapshots(ctx, *wt))
	}
	return emit(c.Snapshot(ctx, *wt, *gen))

}
