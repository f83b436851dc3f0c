package creds

import (
	"strings"
	"testing"
)

// BenchmarkCut times Network.Cut (close tunnels + delete and confirm the
// veth) with 10 open CONNECT tunnels.
func BenchmarkHelperRoundTrip(b *testing.B) {
	f := newBrokerFixture(b)
	f.b.Grant(1, []Credential{{Protocol: "https", Host: "github.com", Username: "u", Password: "p"}})
	f.setIdentity(1, true)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if out, code := f.get(b, "protocol=https\nhost=github.com\n\n"); code != 0 || !strings.Contains(out, "password=p") {
			b.Fatal("no answer")
		}
	}
}

// sinkServer reads exactly size bytes per connection, then writes one byte.
