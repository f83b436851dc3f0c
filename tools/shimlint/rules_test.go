package main

import (
	"testing"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/analysistest"
)

// Each rule catches what it forbids in code that breaks it (the "want"
// comments of its package), passes what it allows, and keeps out of the
// packages it does not cover (the reaper, code outside the binary).
func TestRules(t *testing.T) {
	dir := analysistest.TestData()
	const m = "github.com/shimdev/shim/"
	outside := []string{m + "internal/reaper", m + "examples/client"}
	for _, tc := range []struct {
		a   *analysis.Analyzer
		pkg string
	}{
		{oneReaper, "internal/waits"},
		{hardGit, "internal/gits"},
		{atPaths, "internal/gitguard"},
		{atPaths, "internal/gitformat"},
		{size, "internal/long"},
	} {
		t.Run(tc.a.Name, func(t *testing.T) {
			analysistest.Run(t, dir, tc.a, append([]string{m + tc.pkg}, outside...)...)
		})
	}
}
