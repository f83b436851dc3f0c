package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shimdev/shim/api"
)

func TestStateSurvivesARoundTripAndCorruptionFailsClosed(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state.json")
	st := persisted{Highest: 9, Started: &startedRecord{Generation: 9, SpecHash: "h"}}
	if err := st.save(p); err != nil {
		t.Fatal(err)
	}
	got, err := loadState(p)
	if err != nil || got.Highest != 9 || got.Started.SpecHash != "h" {
		t.Fatalf("reload: %+v %v", got, err)
	}
	os.WriteFile(p, []byte("{half"), 0o600)
	if _, err := loadState(p); err == nil {
		t.Fatal("a corrupt state file must not read as generation 0")
	}
}

func TestSpecHashIgnoresTheSecretButNotTheRest(t *testing.T) {
	a := api.StartRequest{Generation: 1, Command: []string{"x"},
		Credentials: []api.Credential{{Protocol: "https", Host: "h", Username: "u", Password: "one"}}}
	b := a
	b.Credentials = []api.Credential{{Protocol: "https", Host: "h", Username: "u", Password: "two"}}
	if specHash(a) != specHash(b) {
		t.Fatal("the hash must not depend on the secret")
	}
	c := a
	c.Command = []string{"y"}
	if specHash(a) == specHash(c) {
		t.Fatal("different commands must hash differently")
	}
	if strings.Contains(fmt.Sprint(a.Credentials), "one") || strings.Contains(fmt.Sprintf("%#v", a.Credentials[0]), "one") {
		t.Fatal("a printed credential shows the secret")
	}
}

func TestHarnessEnvIsOnlyWhatItIsGiven(t *testing.T) {
	t.Setenv("SHIM_SECRET_OF_SHIM", "x")
	env := harnessEnv(api.StartRequest{Generation: 4, Env: []string{"A=1"}}, "/home/agent")
	joined := strings.Join(env, "\n")
	for _, want := range []string{"A=1", "PATH=" + defaultPath, "HOME=/home/agent", "SHIM_GENERATION=4"} {
		if !strings.Contains(joined, want) {
			t.Errorf("env lacks %s: %v", want, env)
		}
	}
	if strings.Contains(joined, "SHIM_SECRET_OF_SHIM") {
		t.Fatal("shim's own environment leaked into the harness")
	}
}

func TestLookupUser(t *testing.T) {
	c, _, err := lookupUser("1234:5678")
	if err != nil || c.Uid != 1234 || c.Gid != 5678 || len(c.Groups) != 0 {
		t.Fatalf("%+v %v", c, err)
	}
	if c, _, err = lookupUser("root"); err != nil || c.Uid != 0 {
		t.Fatalf("root: %+v %v", c, err)
	}
	if _, _, err = lookupUser("no-such-user-here"); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("unknown user: %v", err)
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]int{"TERM": 15, "SIGKILL": 9, "usr1": 10, "2": 2} {
		if s, err := ParseSignal(in); err != nil || int(s) != want {
			t.Errorf("%s: %v %v", in, s, err)
		}
	}
	if _, err := ParseSignal("SIGNOPE"); err == nil {
		t.Error("unknown signal accepted")
	}
}
