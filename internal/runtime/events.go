package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// DefaultEventsKept is how many events shim keeps for readers that
// reconnect or fall behind (--events-kept).
const DefaultEventsKept = 4096

// events numbers every event (api.Event.Seq, from 1) and keeps the last
// kept of them in a ring. Readers do not get a buffer of their own: each
// holds a cursor into the ring and reads at its own pace, so a publisher
// (a fence) never waits for a reader, memory is the ring whatever the
// readers do, and a reader the ring overtook learns exactly what it
// missed (a gap event, From..To) instead of losing it silently, as it did
// when each subscriber had a channel that dropped on full.
type events struct {
	instance string // Event.Instance: this shim's, random; set once
	mu       sync.Mutex
	ring     []api.Event // guarded by mu: ring[(seq-1) % len(ring)] is event seq, for the last len(ring) seqs
	last     uint64      // guarded by mu: seq of the newest event; 0: none yet
	// changed (guarded by mu) is closed and replaced when an event is
	// published: the readers waiting for one wake up.
	changed chan struct{}
	subs    map[*subscriber]struct{} // guarded by mu: subscribe's
}

func newEvents(kept int) *events {
	if kept <= 0 {
		kept = DefaultEventsKept
	}
	var id [8]byte
	rand.Read(id[:])
	return &events{instance: hex.EncodeToString(id[:]), ring: make([]api.Event, kept), changed: make(chan struct{})}
}

// publish numbers and keeps an event and offers it to every subscriber;
// data is its type's api.*Data (nil for a type without one).
func (e *events) publish(typ string, gen uint64, data any) {
	ev := api.Event{Instance: e.instance, Type: typ, Generation: gen, Time: time.Now().UTC(), Data: data}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.last++
	ev.Seq = e.last
	e.ring[(ev.Seq-1)%uint64(len(e.ring))] = ev
	close(e.changed)
	e.changed = make(chan struct{})
	for s := range e.subs {
		s.offer(ev)
	}
}

// oldestLocked is the seq of the oldest event still kept (last+1 when none).
func (e *events) oldestLocked() uint64 {
	if n := uint64(len(e.ring)); e.last > n {
		return e.last - n + 1
	}
	return 1
}

// eventReader is one reader's cursor: the seq of the next event it reads.
type eventReader struct {
	e    *events
	next uint64
}

// reader starts a reader after seq since: every event published later
// than since is read (or reported as a gap). A since of nil starts after
// the newest event (only what is published from now on: GET /v1/events
// without since). A since of another shim is BAD_REQUEST (sequence numbers
// start again at 1 when shim starts): one whose instance is not this
// shim's, or, without an instance, one ahead of the newest event.
func (e *events) reader(since *uint64, instance string) (*eventReader, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if since == nil {
		return &eventReader{e: e, next: e.last + 1}, nil
	}
	if instance != "" && instance != e.instance {
		return nil, errs.New(api.CodeBadRequest, "since %d is of shim instance %q, and this one is %q "+
			"(sequence numbers start at 1 when shim starts): read again with since=0", *since, instance, e.instance)
	}
	if *since > e.last {
		return nil, errs.New(api.CodeBadRequest, "since %d is ahead of the newest event (%d): it is from another shim "+
			"(sequence numbers start at 1 when shim starts); read again with since=0", *since, e.last)
	}
	return &eventReader{e: e, next: *since + 1}, nil
}

// read returns the events after the cursor, at most max of them, and
// moves the cursor past them. When events the reader had not read were
// overwritten, the first one returned is a gap event saying which. It
// blocks until there is something to return or ctx ends (then ctx's
// error).
func (r *eventReader) read(ctx context.Context, max int) ([]api.Event, error) {
	for {
		r.e.mu.Lock()
		if out := r.takeLocked(max); len(out) > 0 {
			r.e.mu.Unlock()
			return out, nil
		}
		changed := r.e.changed
		r.e.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (r *eventReader) takeLocked(max int) []api.Event {
	e := r.e
	if r.next > e.last {
		return nil
	}
	var out []api.Event
	if oldest := e.oldestLocked(); r.next < oldest {
		out = append(out, api.Event{Instance: e.instance, Type: api.EventGap, Time: time.Now().UTC(),
			From: r.next, To: oldest - 1, Lost: oldest - r.next})
		r.next = oldest
	}
	for ; r.next <= e.last && len(out) < max; r.next++ {
		out = append(out, e.ring[(r.next-1)%uint64(len(e.ring))])
	}
	return out
}

// subscribe returns a channel of the events published from now on and a
// function that ends the subscription: for shim's own use and the tests
// (the API reads the ring: server_logs.go). Each event is in the channel
// when publish returns, as it always was; when the channel is full, the
// events that do not fit are not lost silently: the next publish that
// finds room puts a gap event saying which before its own.
func (e *events) subscribe() (<-chan api.Event, func()) {
	s := &subscriber{ch: make(chan api.Event, 256)}
	e.mu.Lock()
	if e.subs == nil {
		e.subs = map[*subscriber]struct{}{}
	}
	e.subs[s] = struct{}{}
	e.mu.Unlock()
	return s.ch, func() {
		e.mu.Lock()
		delete(e.subs, s)
		e.mu.Unlock()
	}
}

// subscriber is one subscription's channel and the events it missed
// (from..to, none when from is 0). Guarded by events.mu.
type subscriber struct {
	ch       chan api.Event
	from, to uint64
}

// offer puts ev in the channel, after a gap event for what was missed
// before; what does not fit is added to the gap. events.mu held.
func (s *subscriber) offer(ev api.Event) {
	if s.from != 0 {
		if len(s.ch)+2 > cap(s.ch) {
			s.to = ev.Seq
			return
		}
		s.ch <- api.Event{Instance: ev.Instance, Type: api.EventGap, Time: ev.Time, From: s.from, To: s.to, Lost: s.to - s.from + 1}
		s.from, s.to = 0, 0
	}
	select {
	case s.ch <- ev:
	default:
		s.from, s.to = ev.Seq, ev.Seq
	}
}
