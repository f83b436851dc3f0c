// Package reaper is the one place that waits.
package reaper

import "syscall"

func reap() {
	var ws syscall.WaitStatus
	_, _ = syscall.Wait4(-1, &ws, 0, nil)
}
