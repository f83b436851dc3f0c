package runtime

import (
	"context"
	"testing"

	"github.com/shimdev/shim/api"
)

func u64(n uint64) *uint64 { return &n }

// readAll reads what r has now, without waiting.
func readAll(t *testing.T, r *eventReader) []api.Event {
	t.Helper()
	var out []api.Event
	for {
		r.e.mu.Lock()
		evs := r.takeLocked(3) // small batches: the gap and the batching meet
		r.e.mu.Unlock()
		if len(evs) == 0 {
			return out
		}
		out = append(out, evs...)
	}
}

func TestEventsAreNumberedFromOneAndReplayedAfterSince(t *testing.T) {
	e := newEvents(8)
	for i := range 5 {
		e.publish(api.EventStarted, uint64(i+1), nil)
	}
	r, err := e.reader(u64(2), "")
	if err != nil {
		t.Fatal(err)
	}
	got := readAll(t, r)
	if len(got) != 3 || got[0].Seq != 3 || got[2].Seq != 5 || got[0].Generation != 3 {
		t.Fatalf("since 2: %+v", got)
	}
	all, _ := e.reader(u64(0), "")
	if got := readAll(t, all); len(got) != 5 || got[0].Seq != 1 {
		t.Fatalf("since 0: %+v", got)
	}
	now, _ := e.reader(nil, "")
	if got := readAll(t, now); len(got) != 0 {
		t.Fatalf("without since, only what comes next: %+v", got)
	}
	e.publish(api.EventFenced, 5, nil)
	if got := readAll(t, now); len(got) != 1 || got[0].Seq != 6 {
		t.Fatalf("after a publish: %+v", got)
	}
}

func TestASinceOlderThanTheRingGetsAGapSayingWhatWasLost(t *testing.T) {
	e := newEvents(4)
	for i := range 10 {
		e.publish(api.EventStarted, uint64(i+1), nil)
	}
	r, _ := e.reader(u64(1), "")
	got := readAll(t, r)
	// Kept: 7..10. The reader asked for 2.. : 2..6 are lost, and it is told.
	if len(got) != 5 || got[0].Type != api.EventGap || got[0].From != 2 || got[0].To != 6 || got[0].Lost != 5 || got[0].Seq != 0 {
		t.Fatalf("got %+v", got)
	}
	if got[1].Seq != 7 || got[4].Seq != 10 {
		t.Fatalf("after the gap: %+v", got[1:])
	}
}

// A reader that does not read while more events than the ring holds are
// published loses them, and is told exactly which: what it read plus what
// the gaps say it lost is every event published. The control is the
// subscription shim had before, a channel per reader that dropped on full:
// the same slow reader got fewer events than were published, and nothing
// said so.
func TestASlowReaderGetsAGapNeverASilentLoss(t *testing.T) {
	const kept, published = 16, 1000
	e := newEvents(kept)
	slow, _ := e.reader(nil, "")
	control := newDroppingSubscriber(kept)
	for i := range published {
		e.publish(api.EventStarted, uint64(i+1), nil)
		control.offer(api.Event{Seq: uint64(i + 1)})
	}
	var read, lost uint64
	next := uint64(1)
	for _, ev := range readAll(t, slow) {
		if ev.Type == api.EventGap {
			if ev.From != next {
				t.Fatalf("gap from %d, expected %d", ev.From, next)
			}
			lost += ev.Lost
			next = ev.To + 1
			continue
		}
		if ev.Seq != next {
			t.Fatalf("event %d after %d: a silent loss", ev.Seq, next-1)
		}
		read++
		next++
	}
	if read+lost != published || read != kept {
		t.Errorf("read %d + lost %d, published %d (kept %d)", read, lost, published, kept)
	}
	if got := uint64(len(control.ch)); got >= published {
		t.Errorf("control: the dropping channel got %d of %d", got, published)
	}
	t.Logf("slow reader: read %d, told it lost %d, of %d published; the old dropping channel: got %d, told nothing", read, lost, published, len(control.ch))
}

// droppingSubscriber is the subscription before the ring (events.go at
// 2e3734f): a buffered channel, events dropped when it is full.
type droppingSubscriber struct{ ch chan api.Event }

func newDroppingSubscriber(n int) *droppingSubscriber {
	return &droppingSubscriber{ch: make(chan api.Event, n)}
}

func (d *droppingSubscriber) offer(ev api.Event) {
	select {
	case d.ch <- ev:
	default:
	}
}

func TestASinceAheadOfTheNewestEventIsRefused(t *testing.T) {
	e := newEvents(4)
	e.publish(api.EventStarted, 1, nil)
	if _, err := e.reader(u64(1), ""); err != nil {
		t.Fatalf("since the newest: %v", err)
	}
	if _, err := e.reader(u64(2), ""); api.CodeOf(err) != api.CodeBadRequest {
		t.Fatalf("since ahead: %v", err)
	}
}

func TestAReaderWaitsForTheNextEventAndEndsWithItsContext(t *testing.T) {
	e := newEvents(4)
	r, _ := e.reader(nil, "")
	got := make(chan []api.Event)
	go func() {
		evs, _ := r.read(context.Background(), 10)
		got <- evs
	}()
	e.publish(api.EventFenced, 3, nil)
	if evs := <-got; len(evs) != 1 || evs[0].Seq != 1 {
		t.Fatalf("got %+v", evs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.read(ctx, 10); err == nil {
		t.Fatal("a cancelled read returned no error")
	}
}

// A subscription has each event when publish returns; one whose channel
// is full is told what it missed at the next publish that finds room.
func TestASubscriptionThatFellBehindGetsAGap(t *testing.T) {
	e := newEvents(8)
	ch, stop := e.subscribe()
	defer stop()
	for i := range 300 {
		e.publish(api.EventStarted, uint64(i+1), nil)
	}
	if len(ch) != cap(ch) {
		t.Fatalf("%d in the channel", len(ch))
	}
	for range 10 {
		<-ch
	}
	e.publish(api.EventFenced, 301, nil)
	var got []api.Event
	for len(ch) > 0 {
		got = append(got, <-ch)
	}
	read, lost := uint64(256), uint64(0)
	for _, ev := range got {
		if ev.Type == api.EventGap {
			lost += ev.Lost
			if ev.From != 257 || ev.To != 300 {
				t.Errorf("gap %d..%d", ev.From, ev.To)
			}
		} else if ev.Seq == 301 {
			read++
		}
	}
	if read+lost != 301 || got[len(got)-1].Seq != 301 {
		t.Errorf("read %d lost %d: %+v", read, lost, got)
	}
}

// A since numbered by another shim (it restarted) is refused, not read as
// this one's: the reader would skip this shim's first events silently.
func TestASinceOfAnotherShimIsRefused(t *testing.T) {
	e := newEvents(4)
	for range 3 {
		e.publish(api.EventStarted, 1, nil)
	}
	other := newEvents(4)
	if e.instance == "" || e.instance == other.instance {
		t.Fatalf("instances %q %q", e.instance, other.instance)
	}
	if _, err := e.reader(u64(2), other.instance); api.CodeOf(err) != api.CodeBadRequest {
		t.Errorf("since of another instance: %v", err)
	}
	r, err := e.reader(u64(2), e.instance)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, r); len(got) != 1 || got[0].Seq != 3 || got[0].Instance != e.instance {
		t.Errorf("since of this instance: %+v", got)
	}
}
