package runtime

import (
	"testing"

	"github.com/shimdev/shim/internal/testutil"
)

// TestPeerCredReliableOnLinux: on Linux SO_PEERCRED credits a connection
// to the connecting thread's effective uid, so the probe's connection as
// uid 65534 reads as 65534, not as shim (under gVisor it reads as shim:
// the runtime matrix's gVisor row checks that through status).
func TestPeerCredReliableOnLinux(t *testing.T) {
	testutil.NeedRoot(t)
	ok, err := peerCredReliable()
	if err != nil || !ok {
		t.Fatalf("peerCredReliable = %v, %v; want true on Linux", ok, err)
	}
}
