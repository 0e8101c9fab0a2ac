package core

import (
	"math"
	"slices"
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
	got, size, carry := b.gather([]*request{first}, first.size(), 4, timer, lingerMax)
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
	got, _, carry = b.gather([]*request{first}, first.size(), 10, timer, lingerMax)
	if len(got) != 2 || carry != admin || len(b.requests) != 1 {
		t.Errorf("admin request: took %d, carry %v (want the admin request), left %d queued", len(got), carry, len(b.requests))
	}

	b = lingerBroker(3 * sendRequest(1000).size())
	for range 5 {
		b.requests <- sendRequest(1000)
	}
	big := sendRequest(1000)
	got, size, _ = b.gather([]*request{big}, big.size(), 10, timer, lingerMax)
	if len(got) != 3 || size < b.opts.MaxCommitBytes {
		t.Errorf("size cap %d: took %d requests of %d bytes in all", b.opts.MaxCommitBytes, len(got), size)
	}

	b = lingerBroker(1 << 20)
	for range 3 {
		b.requests <- sendRequest(10)
	}
	if got, _, carry = b.gather([]*request{first}, first.size(), math.MaxInt, nil, 0); len(got) != 4 || carry != nil || len(b.requests) != 0 {
		t.Errorf("no linger: took %d of the 4 there, carry %v", len(got), carry)
	}
	if b.lingering.Load() {
		t.Error("lingering set by a gather that does not wait")
	}

	b = lingerBroker(1 << 20)
	close(b.closing)
	if got, _, _ = b.gather([]*request{first}, first.size(), 10, timer, lingerMax); len(got) != 1 {
		t.Errorf("closing: took %d", len(got))
	}

	b = lingerBroker(1 << 20)
	done := make(chan int)
	go func() {
		got, _, _ := b.gather([]*request{first}, first.size(), 10, timer, lingerMax)
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

// TestGroupCommitExpectsWhatIsInFlight: after a commit the next round
// expects every request still unanswered, waits for them only when more
// than one is expected, and backs off (twice as many rounds after each miss
// in a row, up to maxSkippedRounds) when waiting did not pay.
func TestGroupCommitExpectsWhatIsInFlight(t *testing.T) {
	b := lingerBroker(1 << 20)
	for n := range int64(minExpected) {
		b.inFlight.Store(n)
		observe300(b)
		if b.expected.Load() != n || b.groupUntil.Load() != 0 {
			t.Fatalf("%d in flight: expected %d, wait %v; want %d, no wait (a lone send commits alone)", n, b.expected.Load(), b.groupUntil.Load() != 0, n)
		}
	}
	b.inFlight.Store(12)
	observe300(b)
	if b.expected.Load() != 12 || b.groupUntil.Load() == 0 {
		t.Fatalf("12 in flight: expected %d, wait %v; want 12, wait", b.expected.Load(), b.groupUntil.Load() != 0)
	}
	if bound := b.lingerBound(); bound <= 0 || bound > lingerMax {
		t.Errorf("linger bound %v outside (0, %v]", bound, lingerMax)
	}
	if until := time.Unix(0, b.groupUntil.Load()); time.Until(until) > 2*lingerMax {
		t.Errorf("the round waits until %v from now, more than two commit times", time.Until(until))
	}
	saved := b.groupUntil.Load()
	b.groupUntil.Store(time.Now().Add(-time.Microsecond).UnixNano())
	if b.waitsForGroup() {
		t.Error("a request coming after the round's window waits for the round")
	}
	b.groupUntil.Store(saved)

	// roundsWithoutWait counts the rounds after a miss that do not wait.
	roundsWithoutWait := func() int {
		n := 0
		for observe300(b); b.groupUntil.Load() == 0; observe300(b) {
			n++
			if n > 1000 {
				t.Fatal("never waits again")
			}
		}
		return n
	}
	var skipped []int
	for range 8 {
		b.lingered(11, lingerPaid-1) // under half of the missing came, and too few to pay
		skipped = append(skipped, roundsWithoutWait())
	}
	want := []int{2, 4, 8, 16, 32, maxSkippedRounds, maxSkippedRounds, maxSkippedRounds}
	if !slices.Equal(skipped, want) {
		t.Errorf("rounds without waiting after misses in a row: %v, want %v", skipped, want)
	}
	b.lingered(11, 6) // half came: it paid
	b.lingered(11, 0)
	if got := roundsWithoutWait(); got != 2 {
		t.Errorf("a miss after a wait that paid skipped %d rounds, want 2 (the back-off starts again)", got)
	}
	b.lingered(11, 0)
	b.lingered(40, lingerPaid) // few of many, yet enough to pay
	b.lingered(11, 0)
	if got := roundsWithoutWait(); got != 2 {
		t.Errorf("a miss after a wait that paid skipped %d rounds, want 2 (the back-off starts again)", got)
	}
}

// TestGroupCommitExpectsArrivingRequests: requests the API counted on
// arrival (still being read or decoded) are expected too, and no longer
// once done.
func TestGroupCommitExpectsArrivingRequests(t *testing.T) {
	b := lingerBroker(1 << 20)
	b.arrivedFunc = b.arrived
	b.inFlight.Store(2)
	var dones []func()
	for range 9 {
		dones = append(dones, b.Arriving())
	}
	observe300(b)
	if got := b.expected.Load(); got != 9 || b.groupUntil.Load() == 0 {
		t.Fatalf("9 arriving, 2 in submit: expected %d, wait %v; want 9, wait", got, b.groupUntil.Load() != 0)
	}
	for _, done := range dones {
		done()
	}
	observe300(b)
	if got := b.expected.Load(); got != 2 {
		t.Errorf("all arrived and answered, 2 in submit: expected %d, want 2", got)
	}
}

// observe300 records a commit that took 300 µs and is durable now.
func observe300(b *Broker) {
	now := time.Now()
	b.observeCommit(now.Add(-300*time.Microsecond), now)
}
