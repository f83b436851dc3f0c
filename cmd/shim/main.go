// Command shim is the init process (PID 1) of an AI-agent sandbox. It runs
// every harness call as a numbered generation in its own cgroup and fences
// older generations completely when a newer one is announced.
//
//	shim init  [flags] [-- SERVICE CMD...]   the init process
//	shim ctl   [--runtime-dir DIR] VERB ...  the control client
//	shim credential get|store|erase          git credential helper (inside harnesses)
//	shim demo                                a fence, end to end, on this machine
//	shim bench                               fence benchmarks against their baselines
package main

import (
	"fmt"
	"os"
	"runtime/debug"

	"github.com/shimdev/shim/internal/creds"
	"github.com/shimdev/shim/internal/layers"
	"github.com/shimdev/shim/internal/runtime"
)

// version is set at build time (scripts/build: -ldflags "-X
// main.version=$(git describe --always --dirty)"); a build without it
// takes the revision go build recorded (versionOf).
var version = "dev"

func init() { version = versionOf(version, debug.ReadBuildInfo) }

// versionOf is the stamped version, else "dev-" and the VCS revision go
// build recorded (12 digits, "-dirty" when the tree was modified), else
// the module's version, else "dev".
func versionOf(stamped string, info func() (*debug.BuildInfo, bool)) string {
	if stamped != "" && stamped != "dev" {
		return stamped
	}
	bi, ok := info()
	if !ok {
		return "dev"
	}
	var rev, dirty string
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			rev = s.Value
		case s.Key == "vcs.modified" && s.Value == "true":
			dirty = "-dirty"
		}
	}
	if rev != "" {
		return "dev-" + rev[:min(12, len(rev))] + dirty
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return "dev"
}

// usage is the README's CLI synopsis (TestHelpListsTheREADMEsSynopsis
// keeps them together).
var usage = `usage:
  shim init [--runtime-dir DIR] [--cgroup-root PATH] [--log-format text|json] [-- SERVICE CMD...]
       [--grace 8s] [--kill-timeout 10s] [--freeze-timeout 5s] [--allow-uid UID]... [--socket-group GID]
       [--keep-snapshots 100] [--keep-generations 100] [--keep-bytes 268435456]
       [--audit-max-bytes 16777216] [--audit-keep 3] [--subnet 169.254.64.0/18] [--mode cgroup2|cgroup1|pidns]
       [--placement auto|clone|stub] [--mount-proc] [--log-level info]
       [--worktree DIR]... [--exit-grace 2s] [--log-max 67108864] [--git-timeout 60s]
       [--restore-timeout 5m] [--default-memory-max 90%] [--default-pids-max 90%] [--reserve 8388608]
       [--isolation auto|scan] [--layers /var/lib/shim/layers] [--lower-group 65533] [--persist PATH]... [--keep-layers 1]
       [--keep-layers-bytes 1073741824] [--layers-reserve 67108864] [--root-layer-size 1073741824] [--worktree-layer-size 0]
       [--require-isolation] [--copy-output] [--events-kept 4096] [--exec-output-max 16777216]
       [--listen vsock:PORT|serial:NAME]...
  shim ctl  [--runtime-dir DIR] VERB ...    the control client (shim ctl --help):
` + nested(ctlVerbs+ctlExecVerbs) + `  shim credential get|store|erase          git credential helper (inside harnesses)
  shim demo                                a fence, end to end, on this machine (as root)
  shim bench [--rounds 5] [--orphans 5000] | shim bench --soak N [--every 100] [--shim BIN] [--init-args "FLAGS"] [--steps]
  shim bench fence [--sizes 100,5000,50000,200000] [--changes 10,100,1000] [--rounds 5] [--quick] [--steps] [--baseline BIN]
  shim version
`

func main() {
	if (len(os.Args) < 2 || os.Args[1] == "init") && isKernelInit() {
		os.Exit(runVMInit(os.Args[1:])) // vm.go: it powers the machine off instead
	}
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "init":
		os.Exit(runInit(args))
	case "ctl":
		os.Exit(runCtl(args))
	case "credential":
		os.Exit(creds.HelperMain(args, os.Stdin, os.Stdout, os.Stderr, os.Getenv))
	case "demo":
		os.Exit(runDemo(args))
	case "bench":
		os.Exit(runBench(args))
	case runtime.StubArg:
		os.Exit(runtime.RunStub(args))
	case layers.StubArg:
		os.Exit(layers.RunStub(args))
	case serviceStubArg:
		os.Exit(runServiceStub(args))
	case runtime.ProbeArg:
		os.Exit(0)
	case runtime.HoldArg:
		os.Exit(runtime.RunHold())
	case runtime.ReachArg:
		os.Exit(runtime.RunReach(args))
	case "version", "--version":
		fmt.Println("shim", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "shim: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
}
