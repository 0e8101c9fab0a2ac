package core_test

import (
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// A lease that ran out is a failed attempt that counts after a restart
// too: the next delivery's attempt continues, and maxRetries holds.
func TestExpiredAttemptsSurviveRestart(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("t", 1)
	two := 2
	e.subscribe("t", "g", core.SubscriptionConfig{MaxRetries: &two})
	e.send("t", "m")
	short := core.PullRequest{MaxMessages: 1, Invisible: time.Second}
	for want := 1; want <= 2; want++ {
		got := e.pull("t", "g", short)
		if len(got) != 1 || got[0].Attempt != want {
			t.Fatalf("delivery %d: got %+v", want, got)
		}
		clk.Advance(2 * time.Second)
	}
	// The second lease ran out on the broker's watch only if a pull saw it.
	if got := e.pull("t", "g", short); len(got) != 1 || got[0].Attempt != 3 {
		t.Fatalf("third delivery: got %+v, want attempt 3", got)
	}
	clk.Advance(2 * time.Second)
	if got := e.pull("t", "g", core.PullRequest{MaxMessages: 1}); len(got) != 0 {
		t.Fatalf("after maxRetries+1 attempts the message should be dead, got %+v", got)
	}
	// Nobody waits for the pull's DLQ move: its count follows once durable.
	for deadline := time.Now().Add(5 * time.Second); e.subInfo("t", "g").DLQ != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("dlq %d, want 1", e.subInfo("t", "g").DLQ)
		}
		time.Sleep(time.Millisecond)
	}

	e.send("t", "n")
	if got := e.pull("t", "g", short); len(got) != 1 || got[0].Attempt != 1 {
		t.Fatalf("n: got %+v", got)
	}
	clk.Advance(2 * time.Second)
	if got := e.pull("t", "g", short); len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("n again: got %+v", got)
	}
	e.restart() // the second lease is dropped with the run: not a settled attempt
	if got := e.pull("t", "g", short); len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("n after restart: got %+v, want attempt 2 (one expiry stored)", got)
	}
}

// An orderly nack suspends the message's key for the retry delay; a
// restart keeps the key suspended and the attempt counted, while other
// keys flow.
func TestOrderlySuspensionSurvivesRestart(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("t", 1)
	e.subscribe("t", "g", core.SubscriptionConfig{Orderly: true})
	e.sendBatch("t", &core.Message{Body: []byte("k0"), ShardingKey: "k"}, &core.Message{Body: []byte("k1"), ShardingKey: "k"})
	got := e.pull("t", "g", core.PullRequest{MaxMessages: 10})
	if len(got) != 2 || string(got[0].Message.Body) != "k0" || string(got[1].Message.Body) != "k1" {
		t.Fatalf("first pull %+v, want k0, k1", got)
	}
	if _, failed, err := e.b.Nack(t.Context(), "t", "g", []string{got[0].ReceiptHandle}, time.Minute, "later"); err != nil || len(failed) > 0 {
		t.Fatal(err, failed)
	}
	e.sendBatch("t", &core.Message{Body: []byte("other"), ShardingKey: "j"})
	e.restart()

	got = e.pull("t", "g", core.PullRequest{MaxMessages: 10})
	if len(got) != 1 || string(got[0].Message.Body) != "other" {
		t.Fatalf("while k is suspended only j flows, got %d: %+v", len(got), got)
	}
	e.ackAll("t", "g", got)
	clk.Advance(61 * time.Second)
	got = e.pull("t", "g", core.PullRequest{MaxMessages: 10})
	if len(got) != 2 || string(got[0].Message.Body) != "k0" || got[0].Attempt != 2 {
		t.Fatalf("after the delay k0 comes back as attempt 2, got %+v", got)
	}
	if string(got[1].Message.Body) != "k1" || got[1].Attempt != 1 {
		t.Fatalf("then k1 in the same pull, attempt 1, got %+v", got[1])
	}
}

// A nack spends the handle: once the retry is due again, the old handle
// neither extends it (which would hand it out with no attempt counted) nor
// acks it; the next delivery's handle does.
func TestNackedRetryHandleStaysSpentOnceDue(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("t", 1)
	e.subscribe("t", "g", core.SubscriptionConfig{})
	e.send("t", "m")
	ctx := t.Context()
	nack := func(h string) {
		t.Helper()
		if _, failed, err := e.b.Nack(ctx, "t", "g", []string{h}, time.Second, ""); err != nil || len(failed) > 0 {
			t.Fatal(err, failed)
		}
	}
	nack(e.pullOne("t", "g", core.PullRequest{}).ReceiptHandle) // the message becomes a parked retry
	e.advanceTimers(clk, 2*time.Second)
	spent := e.pullOne("t", "g", core.PullRequest{}).ReceiptHandle
	nack(spent) // the retry is parked again, keeping its delivery
	e.advanceTimers(clk, 2*time.Second)
	if n, failed, err := e.b.Extend(ctx, "t", "g", []string{spent}, time.Minute); err != nil || n != 0 || len(failed) != 1 || failed[0].Err != core.ErrReceiptExpired {
		t.Fatalf("extend with the nacked handle: %d, %v, %v; want receipt expired", n, failed, err)
	}
	if n, failed := e.ack("t", "g", spent); n != 0 || len(failed) != 1 {
		t.Fatalf("ack with the nacked handle: %d, %v", n, failed)
	}
	if again := e.pullOne("t", "g", core.PullRequest{}); again.Attempt != 3 {
		t.Fatalf("the retry comes back as attempt %d, want 3", again.Attempt)
	}
}
