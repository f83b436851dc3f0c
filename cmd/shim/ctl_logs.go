package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// runCtlEvents is `shim ctl events [--since SEQ [--instance ID]]`: one
// event a line, until interrupted. Without --since, the events from now on (the stream as it
// always was); with it, those shim kept after SEQ first, and a gap event
// wherever events were lost to this reader.
func runCtlEvents(ctx context.Context, c *client.Client, args []string) int {
	vf := flag.NewFlagSet("events", flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	since := vf.Uint64("since", 0, "")
	instance := vf.String("instance", "", "")
	if err := vf.Parse(args); err != nil || vf.NArg() > 0 || *instance != "" && !flagGiven(vf, "since") {
		return usageError(orMissing(err, "--since with --instance, nothing after the flags"))
	}
	enc := json.NewEncoder(os.Stdout)
	each := func(ev api.Event) error { return enc.Encode(ev) }
	var err error
	switch {
	case *instance != "":
		err = c.EventsAfter(ctx, api.Event{Seq: *since, Instance: *instance}, each)
	case flagGiven(vf, "since"):
		err = c.EventsSince(ctx, *since, each)
	default:
		err = c.Events(ctx, each)
	}
	if errors.Is(err, context.Canceled) {
		return exitOK
	}
	return emit(nil, err)
}

// runCtlLogs is `shim ctl logs [-f] --generation N [--stdout-offset B]
// [--stderr-offset B] [--frames]`: the generation's stdout on stdout and
// its stderr on stderr, as kept in the runtime dir (each capped by
// --log-max); with -f, followed until the generation is over. --frames
// prints the API's frames instead (NDJSON), offsets and drops included.
func runCtlLogs(ctx context.Context, c *client.Client, args []string) int {
	vf := flag.NewFlagSet("logs", flag.ContinueOnError)
	vf.SetOutput(io.Discard)
	gen := vf.Uint64("generation", 0, "")
	var opts client.LogsOptions
	vf.BoolVar(&opts.Follow, "f", false, "")
	vf.BoolVar(&opts.Follow, "follow", false, "")
	vf.Int64Var(&opts.StdoutOffset, "stdout-offset", 0, "")
	vf.Int64Var(&opts.StderrOffset, "stderr-offset", 0, "")
	frames := vf.Bool("frames", false, "")
	if err := vf.Parse(args); err != nil || *gen == 0 || vf.NArg() > 0 {
		return usageError(orMissing(err, "--generation"))
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var err error
	if *frames {
		enc := json.NewEncoder(out)
		_, err = c.Logs(ctx, *gen, opts, func(f api.Frame) error {
			if err := enc.Encode(f); err != nil {
				return err
			}
			return out.Flush()
		})
	} else {
		_, err = c.Logs(ctx, *gen, opts, func(f api.Frame) error {
			switch f.Type {
			case api.FrameStdout:
				if _, err := out.Write(f.Data); err != nil {
					return err
				}
				return out.Flush()
			case api.FrameStderr:
				out.Flush()
				_, err := os.Stderr.Write(f.Data)
				return err
			case api.FrameDropped:
				out.Flush()
				fmt.Fprintf(os.Stderr, "shim ctl logs: %d bytes of %s were not kept (past --log-max, or the runtime dir's filesystem was full)\n", f.Bytes, f.Stream)
			}
			return nil
		})
	}
	out.Flush()
	if errors.Is(err, context.Canceled) {
		return exitOK
	}
	return emit(nil, err)
}
