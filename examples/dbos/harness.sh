#!/bin/sh
# The example's agent: in its worktree it edits, commits and pushes its
# branch in a loop, leaving one file uncommitted each time, until it is
# told to finish (SIGUSR1: it finishes the round and exits 0).
set -u
finish=0
trap 'finish=1' USR1
i=0
while :; do
	i=$((i + 1))
	echo "gen $SHIM_GENERATION edit $i" >> notes.txt
	git add notes.txt && git commit -qm "gen $SHIM_GENERATION edit $i"
	git push -q --force origin "HEAD:$BRANCH" 2>> "$HOME/push.err" || true
	echo "gen $SHIM_GENERATION uncommitted $i" > wip.txt
	[ "$finish" = 1 ] && exit 0
	sleep 0.1
done
