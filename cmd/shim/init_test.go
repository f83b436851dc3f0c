package main

import "testing"

// A bound of the layers that is not a number of bytes is a usage error
// (exit 2), not a layer without a bound.
func TestParseInitRefusesNegativeLayerBounds(t *testing.T) {
	for _, args := range [][]string{
		{"--worktree-layer-size", "-1"},
		{"--keep-layers-bytes", "-5"},
	} {
		if _, code, ok := parseInit(args); ok || code != 2 {
			t.Errorf("%v: ok %v, code %d, want a usage error", args, ok, code)
		}
	}
	if o, code, ok := parseInit([]string{"--worktree-layer-size", "16777216", "--keep-layers-bytes", "0"}); !ok || code != 0 || o.worktreeLayerSize != 16<<20 {
		t.Errorf("valid bounds: ok %v, code %d, %+v", ok, code, o.worktreeLayerSize)
	}
}
