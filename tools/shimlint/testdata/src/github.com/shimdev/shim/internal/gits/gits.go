// Package gits is code of the shim binary (hardgit applies).
package gits

import "os/exec"

func gits() {
	_ = exec.Command("git", "status")          // want `hardgit: git started outside`
	_ = exec.Command("/usr/bin/git", "status") // want `hardgit: git started outside`
	const g = "git"
	_ = exec.Command(g, "status") // want `hardgit: git started outside`
	_ = exec.Command("sh", "-c", "true")
}
