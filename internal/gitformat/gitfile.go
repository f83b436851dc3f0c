package gitformat

import "strings"

// ParseGitfile reads a gitfile (a worktree's .git that is a file: "gitdir:
// PATH"), its first line only, and returns PATH as written (relative to
// the worktree or absolute; where it points is the caller's to check).
// false when it is not one. git reads at most 1 MiB of it
// (read_gitfile_gently, setup.c); the caller bounds what it reads.
func ParseGitfile(data []byte) (string, bool) {
	line, _, _ := strings.Cut(string(data), "\n")
	target, ok := strings.CutPrefix(strings.TrimSpace(line), "gitdir:")
	if !ok {
		return "", false
	}
	return strings.TrimSpace(target), true
}
