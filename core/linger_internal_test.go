package core

import (
	"math"
	"testing"
	"time"
)

func lingerBroker(maxCommitBytes int) *Broker {
	return &Broker{requests: make(chan *request, 64), closing: make(chan struct{}),
		opts: Options{MaxCommitBytes: maxCommitBytes}}
}

func sendRequest(body int) *request {
	return &request{kind: reqAppend, topic: &topic{}, msgs: []*Message{{Body: make([]byte, body)}}}
}

// TestGatherStops checks each way gathering a group ends: enough requests,
// an admin request (handed back to go first next), the commit size cap,
// nothing more queued (without a linger), Close, and the timer when
// nothing comes.
func TestGatherStops(t *testing.T) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	first := sendRequest(10)

	b := lingerBroker(1 << 20)
	for range 5 {
		b.requests <- sendRequest(10)
	}
	got, size, carry := b.gather([]*request{first}, first.size(), 4, timer)
	if len(got) != 4 || carry != nil || len(b.requests) != 2 || size != 4*first.size() {
		t.Errorf("want 4 of 6: took %d (size %d), carry %v, left %d queued", len(got), size, carry, len(b.requests))
	}
	if b.lingering.Load() {
		t.Error("lingering still set after the linger")
	}

	b = lingerBroker(1 << 20)
	admin := &request{kind: reqAdmin}
	b.requests <- sendRequest(10)
	b.requests <- admin
	b.requests <- sendRequest(10)
	got, _, carry = b.gather([]*request{first}, first.size(), 10, timer)
	if len(got) != 2 || carry != admin || len(b.requests) != 1 {
		t.Errorf("admin request: took %d, carry %v (want the admin request), left %d queued", len(got), carry, len(b.requests))
	}

	b = lingerBroker(3 * sendRequest(1000).size())
	for range 5 {
		b.requests <- sendRequest(1000)
	}
	big := sendRequest(1000)
	got, size, _ = b.gather([]*request{big}, big.size(), 10, timer)
	if len(got) != 3 || size < b.opts.MaxCommitBytes {
		t.Errorf("size cap %d: took %d requests of %d bytes in all", b.opts.MaxCommitBytes, len(got), size)
	}

	b = lingerBroker(1 << 20)
	for range 3 {
		b.requests <- sendRequest(10)
	}
	if got, _, carry = b.gather([]*request{first}, first.size(), math.MaxInt, nil); len(got) != 4 || carry != nil || len(b.requests) != 0 {
		t.Errorf("no linger: took %d of the 4 there, carry %v", len(got), carry)
	}
	if b.lingering.Load() {
		t.Error("lingering set by a gather that does not wait")
	}

	b = lingerBroker(1 << 20)
	close(b.closing)
	if got, _, _ = b.gather([]*request{first}, first.size(), 10, timer); len(got) != 1 {
		t.Errorf("closing: took %d", len(got))
	}

	b = lingerBroker(1 << 20)
	done := make(chan int)
	go func() {
		got, _, _ := b.gather([]*request{first}, first.size(), 10, timer)
		done <- len(got)
	}()
	select {
	case n := <-done:
		if n != 1 {
			t.Errorf("nothing came, yet the group holds %d", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a linger with nothing coming did not end")
	}
}

// TestSendWhileLingeringJoinsTheGroup: a send that finds the appender
// lingering must queue for its group, not commit alone beside it.
func TestSendWhileLingeringJoinsTheGroup(t *testing.T) {
	b := lingerBroker(1 << 20) // no store: committing would panic
	b.lingering.Store(true)
	if b.commitAlone(sendRequest(1)) {
		t.Fatal("a send committed alone while the appender lingered")
	}
}
