package api

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Every event type's data goes over the wire and comes back as its own
// struct; an unknown type keeps its data raw; no data stays nil.
func TestAnEventsDataDecodesAsItsTypesStruct(t *testing.T) {
	at := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	for _, ev := range []Event{
		{Seq: 1, Type: EventStarted, Generation: 1, Time: at, Data: &StartedData{PID: 42}},
		{Seq: 2, Type: EventExited, Generation: 1, Time: at, Data: &ExitedData{ExitCode: 0}},
		{Seq: 3, Type: EventQuiesced, Generation: 1, Time: at, Data: &QuiescedData{Killed: 0}},
		{Seq: 4, Type: EventFencing, Generation: 1, Time: at, Data: &FencingData{By: 2}},
		{Seq: 5, Type: EventFenced, Generation: 1, Time: at, Data: &FencedData{Killed: 3, Survivors: 0}},
		{Seq: 6, Type: EventFailed, Generation: 2, Time: at, Data: &FailedData{Error: Errorf(CodeStartFailed, "no")}},
		{Seq: 7, Type: EventRemoteMoved, Generation: 1, Time: at, Data: &RemoteMovedData{Remote: "origin", Branch: "main", AtFence: "a", Now: "b"}},
		{Seq: 8, Type: EventLeaseExpired, Generation: 1, Time: at, Data: &LeaseExpiredData{Killed: true}},
		{Seq: 9, Type: EventShutdown, Time: at},
		{Type: EventGap, Time: at, From: 1, To: 3, Lost: 3},
	} {
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		var got Event
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if !reflect.DeepEqual(got, ev) {
			t.Errorf("%s came back as %+v", b, got)
		}
	}
	// Zero values that say something are on the wire: 0 survivors, exit 0.
	b, _ := json.Marshal(Event{Type: EventFenced, Data: &FencedData{}})
	if !strings.Contains(string(b), `"data":{"killed":0,"survivors":0}`) {
		t.Errorf("fenced with 0 survivors: %s", b)
	}
	var unknown Event
	if err := json.Unmarshal([]byte(`{"type":"new_kind","generation":1,"time":"2026-12-03T00:00:00Z","data":{"x":1}}`), &unknown); err != nil {
		t.Fatal(err)
	}
	if raw, ok := unknown.Data.(json.RawMessage); !ok || string(raw) != `{"x":1}` {
		t.Errorf("an unknown type's data: %#v", unknown.Data)
	}
	var bad Event
	if err := json.Unmarshal([]byte(`{"type":"fenced","data":{"killed":"three"}}`), &bad); err == nil {
		t.Errorf("a fenced event with a string count decoded: %+v", bad)
	}
}
