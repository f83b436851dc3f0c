package runtime

import (
	"strings"
	"testing"

	"github.com/shimdev/shim/internal/gitguard"
)

// TestLayersNeedTheAmbientOwnerGuard: layers where the probe allows them
// and the owner's gits carry the ambient capability (the control); scan,
// saying why, under either fallback guard; the probe's own reason wins.
func TestLayersNeedTheAmbientOwnerGuard(t *testing.T) {
	if r := layersRefused("", gitguard.GuardAmbientCap); r != "" {
		t.Errorf("ambient guard: %q", r)
	}
	for _, g := range []string{gitguard.GuardPtraceScope, gitguard.GuardNone} {
		if r := layersRefused("", g); !strings.Contains(r, "no ambient capability") {
			t.Errorf("%s: layers allowed (%q)", g, r)
		}
		if r := layersRefused("make mounts private: invalid argument", g); r != "make mounts private: invalid argument" {
			t.Errorf("%s: the probe's reason lost: %q", g, r)
		}
	}
}
