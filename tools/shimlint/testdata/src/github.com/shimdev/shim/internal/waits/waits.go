// Package waits is code of the shim binary (onereaper applies).
package waits

import (
	"os"
	"os/exec"
	"syscall"
)

func waits(p *os.Process) {
	cmd := exec.Command("true")
	_ = cmd.Run()               // want `onereaper: Run waits for a child outside the reaper`
	_ = cmd.Wait()              // want `onereaper: Wait waits`
	_, _ = cmd.Output()         // want `onereaper: Output waits`
	_, _ = cmd.CombinedOutput() // want `onereaper: CombinedOutput waits`
	_, _ = p.Wait()             // want `onereaper: Wait waits`
	var ws syscall.WaitStatus
	_, _ = syscall.Wait4(-1, &ws, 0, nil) // want `onereaper: Wait4 waits`
	_ = cmd.Start()                       // starting is fine: the reaper waits
}

func allowed() {
	cmd := exec.Command("true")
	//shimlint:allow onereaper: a reason
	_ = cmd.Run()
	_ = cmd.Run() //shimlint:allow onereaper: on the line itself
	//shimlint:allow onereaper:
	_ = cmd.Run() // want `onereaper: Run waits`
}

// allowedFunc carries the exception for the whole function.
//
//shimlint:allow onereaper: the whole function
func allowedFunc() {
	_ = exec.Command("true").Run()
}
