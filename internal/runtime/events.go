package runtime

import (
	"sync"
	"time"

	"github.com/shimdev/shim/api"
)

// events fans generation events out to every /v1/events subscriber. A slow
// subscriber loses events rather than blocking a fence.
type events struct {
	mu   sync.Mutex
	subs map[chan api.Event]struct{}
}

func newEvents() *events { return &events{subs: map[chan api.Event]struct{}{}} }

func (e *events) publish(typ string, gen uint64, data map[string]any) {
	ev := api.Event{Type: typ, Generation: gen, Time: time.Now().UTC(), Data: data}
	e.mu.Lock()
	defer e.mu.Unlock()
	for ch := range e.subs {
		select {
		case ch <- ev:
		default:
		}
	}
}

// Subscribe returns a channel of events and a function that ends the
// subscription.
func (e *events) subscribe() (<-chan api.Event, func()) {
	ch := make(chan api.Event, 256)
	e.mu.Lock()
	e.subs[ch] = struct{}{}
	e.mu.Unlock()
	return ch, func() {
		e.mu.Lock()
		delete(e.subs, ch)
		e.mu.Unlock()
	}
}
