package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shimdev/shim/internal/testutil"
)

// postgres is a Postgres server of the test's own (Debian's package, as
// scripts/deps installs it): a fresh cluster in a temporary dir, owned by
// the postgres user, listening on a free loopback port only, stopped and
// removed when the test ends.
type postgres struct {
	bin, data, url string
	port           int
}

// pgBin finds Debian's server binaries (/usr/lib/postgresql/<v>/bin).
func pgBin() string {
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(m) == 0 {
		return ""
	}
	return filepath.Dir(m[len(m)-1])
}

func startPostgres(t *testing.T) *postgres {
	t.Helper()
	bin := pgBin()
	testutil.Need(t, bin != "", "no Postgres server (apt-get install postgresql)")
	pu, err := user.Lookup("postgres")
	testutil.Need(t, err == nil, "no postgres user")
	uid, _ := strconv.Atoi(pu.Uid)
	gid, _ := strconv.Atoi(pu.Gid)
	dir, err := os.MkdirTemp("", "shim-dbos-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	p := &postgres{bin: bin, data: filepath.Join(dir, "data"), port: port,
		url: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)}
	p.run(t, "initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync")
	p.run(t, "pg_ctl", "-D", p.data, "-w", "-t", "60", "-l", filepath.Join(dir, "log"), "start",
		"-o", fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s -c fsync=off", port, dir))
	t.Cleanup(func() { p.run(t, "pg_ctl", "-D", p.data, "-w", "-m", "fast", "stop") })
	return p
}

// run runs a server binary as the postgres user.
func (p *postgres) run(t *testing.T, name string, args ...string) {
	t.Helper()
	cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", filepath.Join(p.bin, name)}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// database creates a fresh database and returns its URL.
func (p *postgres) database(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", p.port, name)
}
