// Command shimlint checks shim's invariants as rules rather than prose
// (issue 25): it runs as go vet's tool over the main module,
//
//	go build -o /tmp/shimlint . && go vet -vettool=/tmp/shimlint ./...
//
// (scripts/lint does both). The rules, each an analyzer:
//
//   - onereaper: in the PID-1 binary only the reaper waits for children:
//     no (*exec.Cmd).Wait, Run, Output or CombinedOutput, no
//     (*os.Process).Wait, no wait4 outside internal/reaper.
//   - hardgit: git runs only through gitguard's hardened runner: no
//     exec.Command of "git" anywhere else.
//   - atpaths: gitguard, snapshot and gitformat, which read what a harness wrote,
//     open and change files only through the *at calls relative to a
//     directory fd (never following a link a harness planted): no
//     path-taking os call there.
//   - size: no function over 80 lines and no file over 600 lines; those
//     longer today are listed in baseline.txt with their length, and may
//     shrink but not grow.
//
// A line that is a deliberate exception says so with a comment on it or
// on the line above: //shimlint:allow RULE: why. A function's doc comment
// may carry it for the whole function. Test files are not checked.
package main

import (
	"golang.org/x/tools/go/analysis/unitchecker"
)

func main() {
	unitchecker.Main(oneReaper, hardGit, atPaths, size)
}
