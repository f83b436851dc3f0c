package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/client"
)

// logs reads generation n's output through the client and returns its
// stdout, its stderr, the frames and where it stopped.
func logs(t *testing.T, s *Shim, n uint64, opts client.LogsOptions, each func(api.Frame)) (string, string, []api.Frame, *client.LogsResult) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	var frames []api.Frame
	res, err := s.Client.Logs(ctx, n, opts, func(f api.Frame) error {
		switch f.Type {
		case api.FrameStdout:
			out.Write(f.Data)
		case api.FrameStderr:
			errb.Write(f.Data)
		}
		f.Data = nil
		frames = append(frames, f)
		if each != nil {
			each(f)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("logs of generation %d: %v", n, err)
	}
	return out.String(), errb.String(), frames, res
}

// A follower gets the output as it is written and, once the generation is
// over, its exit; a reader that comes back later resumes from its offsets.
func TestLogsFollowUntilExitAndReadAgainFromAnOffset(t *testing.T) {
	s := startShim(t, shimOpts{})
	dir := t.TempDir()
	gate := filepath.Join(dir, "gate")
	h := script(t, dir, "h.sh", `echo one; echo err >&2; while [ ! -e "$1" ]; do sleep 0.02; done; echo two; exit 7`)
	s.MustCtl(nil, "start", "--generation", "1", "--", h, gate)

	var seen bytes.Buffer
	out, errs, frames, res := logs(t, s, 1, client.LogsOptions{Follow: true}, func(f api.Frame) {
		if f.Type == api.FrameStdout {
			seen.WriteString("x") // the first line arrived while the harness waits on the gate
			if seen.Len() == 1 {
				if err := os.WriteFile(gate, nil, 0o644); err != nil {
					t.Error(err)
				}
			}
		}
	})
	if out != "one\ntwo\n" || errs != "err\n" {
		t.Errorf("stdout %q stderr %q", out, errs)
	}
	last := frames[len(frames)-1]
	if last.Type != api.FrameExit || last.Exit == nil || last.Exit.ExitCode != 7 || res.Last == nil {
		t.Fatalf("last frame %+v", last)
	}
	if res.StdoutOffset != 8 || res.StderrOffset != 4 {
		t.Errorf("offsets %d %d", res.StdoutOffset, res.StderrOffset)
	}

	// Re-read from the offset after "one\n": only what came after.
	out, errs, frames, _ = logs(t, s, 1, client.LogsOptions{StdoutOffset: 4, StderrOffset: 4}, nil)
	if out != "two\n" || errs != "" || frames[len(frames)-1].Type != api.FrameEnd {
		t.Errorf("from offset 4: stdout %q stderr %q frames %+v", out, errs, frames)
	}
	if frames[0].Offset != 4 {
		t.Errorf("first frame at %d, want 4", frames[0].Offset)
	}

	// The CLI: stdout on stdout, stderr on stderr; -f ends at the exit.
	for _, args := range [][]string{{"logs", "--generation", "1"}, {"logs", "-f", "--generation", "1"}} {
		o, e, code := s.Ctl(args...)
		if code != 0 || o != "one\ntwo\n" || e != "err\n" {
			t.Errorf("ctl %v: exit %d stdout %q stderr %q", args, code, o, e)
		}
	}
	o, _, code := s.Ctl("logs", "--generation", "1", "--stdout-offset", "4", "--frames")
	if code != 0 || !strings.Contains(o, `"type":"stdout","offset":4,"data":"dHdvCg=="`) || !strings.Contains(o, `"type":"end"`) {
		t.Errorf("ctl logs --frames: exit %d %s", code, o)
	}
	if _, e, code := s.Ctl("logs", "--generation", "9"); code != 1 || !strings.Contains(e, api.CodeNotFound) {
		t.Errorf("logs of an unknown generation: exit %d %s", code, e)
	}
}

// A harness writing far past --log-max: the file is a prefix of what it
// wrote, and the reader is told how many bytes were not kept and where the
// stream resumes.
func TestLogsPastTheCapAreDroppedAndSaidSo(t *testing.T) {
	const max, total = 1000, 100000
	s := startShim(t, shimOpts{args: []string{"--log-max", strconv.Itoa(max)}})
	s.MustCtl(nil, "start", "--generation", "1", "--", "sh", "-c", fmt.Sprintf("yes 0123456789abcdef | head -c %d", total))
	out, _, frames, res := logs(t, s, 1, client.LogsOptions{Follow: true}, nil)
	written := strings.Repeat("0123456789abcdef\n", total/17+1)[:total]
	if out != written[:max] {
		t.Errorf("kept output is not the first %d bytes written: %q...", max, out[:min(len(out), 40)])
	}
	file, err := os.ReadFile(filepath.Join(s.RuntimeDir, "gen", "1", "stdout"))
	if err != nil || string(file) != written[:max] {
		t.Errorf("gen/1/stdout is not a prefix of what was written (%d bytes, %v)", len(file), err)
	}
	// Followed while it ran: a dropped frame each time more was dropped,
	// each starting where the one before ended.
	var dropped, at int64 = 0, max
	for _, f := range frames {
		if f.Type != api.FrameDropped {
			continue
		}
		if f.Stream != "stdout" || f.Offset-f.Bytes != at {
			t.Fatalf("dropped frame %+v after offset %d", f, at)
		}
		dropped += f.Bytes
		at = f.Offset
	}
	if dropped != total-max || at != total {
		t.Fatalf("dropped frames say %d bytes up to %d", dropped, at)
	}
	// Read again without following: one dropped frame for all of it.
	_, _, again, _ := logs(t, s, 1, client.LogsOptions{}, nil)
	if d := again[len(again)-2]; d.Type != api.FrameDropped || d.Bytes != total-max || d.Offset != total {
		t.Errorf("read again: %+v", d)
	}
	if res.StdoutOffset != total || frames[len(frames)-1].Type != api.FrameExit {
		t.Errorf("stopped at %d, last %+v", res.StdoutOffset, frames[len(frames)-1])
	}
	var rec api.Generation
	s.MustCtl(&rec, "generation", "--generation", "1")
	if rec.StdoutDropped != total-max {
		t.Errorf("record: %d dropped", rec.StdoutDropped)
	}
}

// readEvents reads events from a stream until stop says so (or ctx ends).
func readEvents(ctx context.Context, t *testing.T, s *Shim, since uint64, stop func([]api.Event) bool) []api.Event {
	t.Helper()
	var got []api.Event
	done := errors.New("done")
	err := s.Client.EventsSince(ctx, since, func(ev api.Event) error {
		got = append(got, ev)
		if stop(got) {
			return done
		}
		return nil
	})
	if !errors.Is(err, done) {
		t.Fatalf("events since %d: %v (got %v)", since, err, got)
	}
	return got
}

func has(evs []api.Event, typ string, gen uint64) bool {
	for _, ev := range evs {
		if ev.Type == typ && ev.Generation == gen {
			return true
		}
	}
	return false
}

// checkSeq checks that evs, gap events included, account for every seq
// from the first one on, and returns how many were read and lost.
func checkSeq(t *testing.T, evs []api.Event) (read, lost uint64) {
	t.Helper()
	var next uint64
	for _, ev := range evs {
		if ev.Type == api.EventGap {
			if next != 0 && ev.From != next || ev.To < ev.From || ev.Lost != ev.To-ev.From+1 {
				t.Fatalf("gap %d..%d (%d) when %d was next", ev.From, ev.To, ev.Lost, next)
			}
			lost += ev.Lost
			next = ev.To + 1
			continue
		}
		if next != 0 && ev.Seq != next {
			t.Fatalf("event %d after %d: lost without a gap event", ev.Seq, next-1)
		}
		read++
		next = ev.Seq + 1
	}
	return read, lost
}

func TestLogsEventsSinceReplaysWhatIsKeptAndSaysWhatIsNot(t *testing.T) {
	const kept = 8
	s := startShim(t, shimOpts{args: []string{"--events-kept", strconv.Itoa(kept)}})
	for n := 1; n <= 4; n++ {
		s.MustCtl(nil, "start", "--generation", strconv.Itoa(n), "--", "sleep", "1000")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	all := readEvents(ctx, t, s, 0, func(evs []api.Event) bool { return has(evs, api.EventStarted, 4) && has(evs, api.EventExited, 3) })
	if g := all[0]; g.Type != api.EventGap || g.From != 1 || g.To < 1 {
		t.Fatalf("since 0 after more than %d events: first %+v", kept, g)
	}
	read, lost := checkSeq(t, all)
	if read > kept || all[len(all)-1].Seq != read+lost {
		t.Errorf("read %d, lost %d, last seq %d", read, lost, all[len(all)-1].Seq)
	}
	var last uint64
	for _, ev := range all {
		last = max(last, ev.Seq)
	}
	// Since a seq still kept: exactly what came after it.
	tail := readEvents(ctx, t, s, last-2, func(evs []api.Event) bool { return len(evs) == 2 })
	if tail[0].Seq != last-1 || tail[1].Seq != last || tail[0].Type == api.EventGap {
		t.Errorf("since %d: %+v", last-2, tail)
	}
	// After an event, checked to be of this shim.
	after := all[len(all)-2]
	var got []api.Event
	stop := errors.New("stop")
	if err := s.Client.EventsAfter(ctx, after, func(ev api.Event) error { got = append(got, ev); return stop }); !errors.Is(err, stop) ||
		got[0].Seq != after.Seq+1 || got[0].Instance != after.Instance || after.Instance == "" {
		t.Errorf("after %d of %q: %v %+v", after.Seq, after.Instance, err, got)
	}
	// A seq from another shim is refused, not waited on or misread.
	if _, e, code := s.Ctl("events", "--since", strconv.FormatUint(last+100, 10)); code != 2 || !strings.Contains(e, api.CodeBadRequest) {
		t.Errorf("since ahead: exit %d %s", code, e)
	}
	if _, e, code := s.Ctl("events", "--since", "1", "--instance", "0000000000000000"); code != 2 || !strings.Contains(e, "instance") {
		t.Errorf("since of another instance: exit %d %s", code, e)
	}
}

// A reader that stops reading while shim publishes more events than its
// connection and the ring hold. The control is what it reads: fewer
// events than were published (before the ring, that was all it got,
// silently); now gap events account for every one it missed.
func TestLogsASlowEventReaderIsToldWhatItMissed(t *testing.T) {
	const kept = 16
	s := startShim(t, shimOpts{args: []string{"--events-kept", strconv.Itoa(kept)}})
	conn, err := net.Dial("unix", filepath.Join(s.RuntimeDir, "shim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// since=0: this reader's stream begins at the first event whenever it
	// was admitted (the plain GET /v1/events begins at its admission).
	if _, err := conn.Write([]byte("GET /v1/events?since=0 HTTP/1.1\r\nHost: shim\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReaderSize(conn, 4096)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("events: %v %v", resp, err)
	}
	// The reader now reads nothing while shim publishes about 4 events a
	// generation: more than the kernel buffers for its socket (wmem_default,
	// with at least 512 bytes of accounting per write) and the ring.
	wmem := 212992
	if b, err := os.ReadFile("/proc/sys/net/core/wmem_default"); err == nil {
		wmem, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	gens := uint64(wmem/512/4 + 2*kept)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for n := uint64(1); n <= gens; n++ {
		// Every fence completes with the reader stuck: nothing waits for it.
		if _, err := s.Client.Start(ctx, api.StartRequest{Generation: n, Command: []string{"sleep", "1000"}}); err != nil {
			t.Fatalf("start %d: %v", n, err)
		}
	}
	var evs []api.Event
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev api.Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
		if ev.Type == api.EventStarted && ev.Generation == gens {
			break
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	read, lost := checkSeq(t, evs)
	published := evs[len(evs)-1].Seq
	gaps := 0
	for _, ev := range evs {
		if ev.Type == api.EventGap {
			gaps++
		}
	}
	t.Logf("%d generations: %d events published, the slow reader read %d and was told it lost %d in %d gap events", gens, published, read, lost, gaps)
	if read >= published {
		t.Fatalf("control: the reader read all %d events; it was not slow enough to lose any", published)
	}
	if gaps == 0 || read+lost != published {
		t.Errorf("read %d + lost %d != published %d (%d gaps): a silent loss", read, lost, published, gaps)
	}
}

// Generation 2, started after generation 1 was fenced, finds in its
// environment and in its hand-off file where generation 1's work went;
// the file is its uid's alone.
func TestLogsTheNextGenerationIsHandedWhatWasAbandoned(t *testing.T) {
	for _, iso := range []string{"scan", "auto"} {
		t.Run(iso, func(t *testing.T) {
			r := newLayerRig(t, iso)
			handedOff(t, r.f, r.s)
		})
	}
}

func handedOff(t *testing.T, f *wtFixture, s *Shim) {
	g1 := script(t, f.bin, "gen1.sh", `echo changed >> README.md; echo new > added.txt; rm delete-me.txt; touch "$1/ready"; exec sleep 1000`)
	s.MustCtl(nil, f.startArgs(1, "--", g1, f.out)...)
	eventually(t, 10*time.Second, "gen 1 edited", func() bool { _, err := os.Stat(filepath.Join(f.out, "ready")); return err == nil })
	g2 := script(t, f.bin, "gen2.sh", `env | grep '^SHIM_' | sort; echo ---; cat "$SHIM_ABANDONED_FILE"; echo ---; exec sleep 1000`)
	var r2 api.StartResult
	s.MustCtl(&r2, f.startArgs(2, "--", g2)...)
	if len(r2.Fenced) != 1 || r2.Fenced[0].SnapshotRef != "refs/shim/abandoned/1" {
		t.Fatalf("fence: %+v", r2.Fenced)
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	enough := errors.New("enough")
	_, err := s.Client.LogsTo(ctx, 2, client.LogsOptions{Follow: true}, writerFunc(func(p []byte) (int, error) {
		out.Write(p)
		if strings.Count(out.String(), "---\n") == 2 {
			return 0, enough
		}
		return len(p), nil
	}), nil)
	if !errors.Is(err, enough) {
		t.Fatalf("gen 2's output: %v: %q", err, out.String())
	}
	parts := strings.Split(out.String(), "---\n")
	env := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(parts[0]), "\n") {
		k, v, _ := strings.Cut(l, "=")
		env[k] = v
	}
	rep := r2.Fenced[0]
	file := filepath.Join(s.RuntimeDir, "handoff", "2.json")
	want := map[string]string{"SHIM_GENERATION": "2", "SHIM_PREVIOUS_GENERATION": "1", "SHIM_PREVIOUS_SNAPSHOT_REF": "refs/shim/abandoned/1",
		"SHIM_PREVIOUS_SNAPSHOT_COMMIT": rep.SnapshotCommit, "SHIM_PREVIOUS_PUSHED": "unknown", "SHIM_ABANDONED_FILE": file}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("gen 2's %s=%q, want %q", k, env[k], v)
		}
	}
	var h api.Abandoned
	if err := json.Unmarshal([]byte(parts[1]), &h); err != nil {
		t.Fatalf("gen 2 read its hand-off %q: %v", parts[1], err)
	}
	if h.Generation != 2 || h.PreviousGeneration != 1 || h.SnapshotCommit != rep.SnapshotCommit || h.Baseline != f.baseline ||
		h.Modified != 1 || h.Added != 1 || h.Deleted != 1 || len(h.Paths) != 3 || h.Worktree != f.wt {
		t.Errorf("hand-off %+v", h)
	}
	// The file is gen 2's uid's: another uid cannot read it.
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o440 || st.Uid != wtUID {
		t.Errorf("hand-off mode %v owner %d", fi.Mode().Perm(), st.Uid)
	}
	cat := exec.Command("cat", file)
	cat.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 12345, Gid: 12345, Groups: []uint32{}}}
	if b, err := cat.CombinedOutput(); err == nil || !strings.Contains(string(b), "Permission denied") {
		t.Errorf("uid 12345 read the hand-off: %v %q", err, b)
	}
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// --copy-output: docker logs shows the harnesses' lines, prefixed.
func TestLogsCopyOutputPrefixesEachLineWithItsGeneration(t *testing.T) {
	s := startShim(t, shimOpts{args: []string{"--copy-output"}})
	s.MustCtl(nil, "start", "--generation", "3", "--", "sh", "-c", "echo hello; echo oops >&2; printf 'no newline'")
	eventually(t, 10*time.Second, "copied output", func() bool {
		l := s.Log.String()
		return strings.Contains(l, "[gen 3] hello\n") && strings.Contains(l, "[gen 3 stderr] oops\n") && strings.Contains(l, "[gen 3] no newline\n")
	})
}

// A harness writing without end while nobody reads shim's stdout: the
// harness is never blocked (it finishes its 20 MB), shim keeps answering,
// and once stdout is read again it says how much it did not copy.
func TestLogsCopyOutputNeverBlocksOnASlowStdout(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s := startShim(t, shimOpts{args: []string{"--copy-output", "--log-max", "65536"}, stdout: w})
	w.Close() // shim holds the write end; nobody reads r until the harness is done
	const total = 20 << 20
	s.MustCtl(nil, "start", "--generation", "1", "--", "sh", "-c", fmt.Sprintf("yes %s | head -c %d; echo finished >&2", strings.Repeat("x", 99), total))
	_, errs, frames, _ := logs(t, s, 1, client.LogsOptions{Follow: true}, nil)
	if errs != "finished\n" || frames[len(frames)-1].Type != api.FrameExit {
		t.Fatalf("the harness did not finish: stderr %q last %+v", errs, frames[len(frames)-1])
	}
	var st api.Status
	s.MustCtl(&st, "status")
	// Now read shim's stdout: what it copied, then the notice.
	got := make(chan string, 1)
	go func() {
		var b bytes.Buffer
		buf := make([]byte, 64<<10)
		for b.Len() < 8<<20 {
			n, err := r.Read(buf)
			b.Write(buf[:n])
			if err != nil || strings.Contains(b.String(), "bytes of harness output not copied") {
				break
			}
		}
		got <- b.String()
	}()
	var copied string
	select {
	case copied = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("no notice on shim's stdout")
	}
	if !strings.HasPrefix(copied, "[gen 1] xxxx") || !strings.Contains(copied, "bytes of harness output not copied") {
		t.Errorf("shim's stdout: %q ... %q", copied[:min(len(copied), 40)], copied[max(0, len(copied)-200):])
	}
	if len(copied) >= total {
		t.Errorf("%d bytes copied to a stdout nobody read: not bounded", len(copied))
	}
	t.Logf("harness wrote %d bytes; %d reached the unread stdout (bounded), the rest was dropped and counted", total, len(copied))
}

// A stdout whose reader is gone (EPIPE, SIGPIPE) costs shim nothing but
// the copy: the harness runs to its end and shim keeps serving.
func TestLogsCopyOutputToAClosedStdout(t *testing.T) {
	s := startShim(t, shimOpts{args: []string{"--copy-output"}, brokenLog: true})
	s.MustCtl(nil, "start", "--generation", "1", "--", "sh", "-c", "i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done")
	out, _, frames, _ := logs(t, s, 1, client.LogsOptions{Follow: true}, nil)
	if !strings.HasSuffix(out, "line 1999\n") || frames[len(frames)-1].Type != api.FrameExit {
		t.Fatalf("the harness did not finish: %d bytes, last %+v", len(out), frames[len(frames)-1])
	}
	s.MustCtl(nil, "start", "--generation", "2", "--", "sh", "-c", "echo again")
	var st api.Status
	s.MustCtl(&st, "status")
	if st.Generation != 2 {
		t.Errorf("status %+v", st)
	}
}
