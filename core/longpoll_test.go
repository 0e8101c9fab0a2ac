package core_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemq/tidemq/core"
)

type pullResult struct {
	got     []core.Delivered
	err     error
	elapsed time.Duration
}

// pullAsync starts a Pull on its own goroutine.
func pullAsync(ctx context.Context, b *core.Broker, topic, group string, req core.PullRequest) <-chan pullResult {
	ch := make(chan pullResult, 1)
	go func() {
		start := time.Now()
		got, err := b.Pull(ctx, topic, group, req)
		ch <- pullResult{got, err, time.Since(start)}
	}()
	return ch
}

// On the real clock: a parked pull answers soon after a send.
func TestLongPollReturnsSoonAfterSend(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 4)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	start := time.Now()
	ch := pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 5 * time.Second})
	go func() {
		if _, err := e.b.Send(context.Background(), "orders", []*core.Message{{Body: []byte("wake")}}); err != nil {
			t.Error(err)
		}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := bodies(r.got); len(got) != 1 || got[0] != "wake" {
		t.Errorf("long poll returned %v, want [wake]", got)
	}
	if elapsed := time.Since(start); elapsed >= 3*time.Second {
		t.Errorf("long poll took %v after the send; it should answer within milliseconds", elapsed)
	}
}

// The tests below run in a synctest bubble: time.Now is the bubble's clock,
// and synctest.Wait makes sure the pull is parked before the test acts.

func newBubbleEnv(t *testing.T) *env {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 2)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	return e
}

func TestLongPollParksUntilSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		ch := pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 20 * time.Second})
		time.Sleep(3 * time.Second)
		synctest.Wait()
		select {
		case r := <-ch:
			t.Fatalf("pull returned after %v before any message: %+v", r.elapsed, r)
		default:
		}
		e.send("orders", "wake")
		r := <-ch
		if r.err != nil || len(r.got) != 1 {
			t.Fatalf("pull = %d messages, %v", len(r.got), r.err)
		}
		if r.elapsed != 3*time.Second {
			t.Errorf("pull answered after %v, want 3s: at once when the send landed", r.elapsed)
		}
	})
}

func TestLongPollEndsEmptyWhenWaitEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		r := <-pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 5 * time.Second})
		if r.err != nil || len(r.got) != 0 {
			t.Fatalf("pull = %d messages, %v; want none", len(r.got), r.err)
		}
		if r.elapsed != 5*time.Second {
			t.Errorf("pull waited %v, want exactly 5s", r.elapsed)
		}
		r = <-pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{})
		if r.elapsed != 0 {
			t.Errorf("pull with no wait took %v", r.elapsed)
		}
	})
}

func TestLongPollWakesWhenALeaseEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		e.send("orders", "slow")
		if first := e.pull("orders", "g", core.PullRequest{Invisible: 3 * time.Second}); len(first) != 1 {
			t.Fatal("nothing pulled")
		}
		r := <-pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 20 * time.Second})
		if r.err != nil || len(r.got) != 1 || r.got[0].Attempt != 2 {
			t.Fatalf("parked pull = %+v, want the message again with attempt 2", r)
		}
		if r.elapsed < 3*time.Second || r.elapsed > 3*time.Second+10*time.Millisecond {
			t.Errorf("redelivered after %v, want as soon as the 3s lease ended", r.elapsed)
		}
	})
}

func TestLongPollWakesOnRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		e.send("orders", "x")
		first := e.pull("orders", "g", core.PullRequest{Invisible: time.Hour})
		ch := pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 20 * time.Second})
		time.Sleep(time.Second)
		synctest.Wait()
		e.b.Release("orders", "g", handles(first))
		r := <-ch
		if len(r.got) != 1 || r.got[0].Attempt != 1 || r.elapsed != time.Second {
			t.Errorf("after release the parked pull got %d messages %+v after %v; want 1, attempt 1, at once", len(r.got), r.got, r.elapsed)
		}
	})
}

func TestStopPollingAnswersParkedPulls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		chs := []<-chan pullResult{
			pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 20 * time.Second}),
			pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 30 * time.Second}),
		}
		time.Sleep(time.Second)
		synctest.Wait()
		e.b.StopPolling()
		for _, ch := range chs {
			r := <-ch
			if r.err != nil || len(r.got) != 0 || r.elapsed != time.Second {
				t.Errorf("after StopPolling: %d messages, err %v, after %v; want empty at once", len(r.got), r.err, r.elapsed)
			}
		}
		// New pulls do not park, but still hand out what is there.
		if r := <-pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 20 * time.Second}); r.elapsed != 0 || len(r.got) != 0 {
			t.Errorf("pull after StopPolling waited %v", r.elapsed)
		}
		e.send("orders", "x")
		if got := e.pull("orders", "g", core.PullRequest{Wait: 20 * time.Second}); len(got) != 1 {
			t.Errorf("pull after StopPolling got %d of 1 ready message", len(got))
		}
		e.b.StopPolling() // idempotent
	})
}

func TestLongPollEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		ctx, cancel := context.WithCancel(t.Context())
		ch := pullAsync(ctx, e.b, "orders", "g", core.PullRequest{Wait: 20 * time.Second})
		time.Sleep(2 * time.Second)
		synctest.Wait()
		cancel()
		if r := <-ch; len(r.got) != 0 || r.elapsed != 2*time.Second {
			t.Errorf("after cancel: %d messages after %v, want none at once", len(r.got), r.elapsed)
		}
		// Nothing was leased for the cancelled pull.
		e.send("orders", "x")
		if got := e.pull("orders", "g", core.PullRequest{}); len(got) != 1 {
			t.Errorf("pull after a cancelled one got %d messages", len(got))
		}
	})
}

func TestLongPollEndsWhenSubscriptionDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		ch := pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 20 * time.Second})
		time.Sleep(time.Second)
		synctest.Wait()
		if err := e.b.DeleteSubscription(t.Context(), "orders", "g"); err != nil {
			t.Fatal(err)
		}
		r := <-ch
		wantErr(t, r.err, core.ErrSubscriptionNotFound)
		if r.elapsed != time.Second {
			t.Errorf("parked pull noticed the delete after %v, want at once", r.elapsed)
		}
	})
}

func TestCloseAnswersParkedPullsAndRefusesWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newBubbleEnv(t)
		ch := pullAsync(t.Context(), e.b, "orders", "g", core.PullRequest{Wait: 20 * time.Second})
		time.Sleep(time.Second)
		synctest.Wait()
		if err := e.b.Close(); err != nil {
			t.Fatal(err)
		}
		if r := <-ch; r.err != nil || len(r.got) != 0 || r.elapsed != time.Second {
			t.Errorf("after Close: %d messages, %v, after %v; want empty at once", len(r.got), r.err, r.elapsed)
		}
		if err := e.b.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		wantErr(t, e.b.Ready(), core.ErrClosed)
		_, err := e.b.Send(t.Context(), "orders", []*core.Message{{Body: []byte("x")}})
		wantErr(t, err, core.ErrClosed)
		_, _, err = e.b.PutTopic(t.Context(), "other", core.TopicConfig{})
		wantErr(t, err, core.ErrClosed)
	})
}
