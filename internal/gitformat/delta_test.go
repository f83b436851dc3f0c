package gitformat

import "testing"

func TestApplyDeltaRefusesBadDeltas(t *testing.T) {
	base := []byte("0123456789")
	for name, d := range map[string][]byte{
		"another base":      {9, 3, 0x91, 0, 3},
		"copy past the end": {10, 3, 0x91, 9, 3},
		"insert past":       {10, 3, 5, 'a'},
		"reserved":          {10, 1, 0},
		"short":             {10, 4, 0x91, 0, 3},
		"too large":         {10, 0x80, 0x80, 0x80, 0x80, 0x10},
	} {
		if _, err := ApplyDelta(base, d, 1<<20); err == nil {
			t.Errorf("%s: applied", name)
		}
	}
	out, err := ApplyDelta(base, []byte{10, 5, 0x91, 2, 3, 2, 'x', 'y'}, 1<<20)
	if err != nil || string(out) != "234xy" {
		t.Errorf("a good delta: %q, %v", out, err)
	}
}
