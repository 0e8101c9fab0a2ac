package core_test

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tidemq/tidemq/core"
)

// SPEC §2: a long poll answers as soon as at least one message is ready.
// Each test below parks a pull with a long wait, then makes a message ready
// by one way other than a new send, and checks the pull answers when the
// message is ready, not when its wait ends. They run in a synctest bubble:
// the times are the bubble's, exact and independent of the machine's load.

const (
	wakeWait   = 20 * time.Second // the parked pull's wait
	wakeParked = time.Second      // how long the pull is parked before the test acts
)

// wakeMode is a kind of subscription the wake-ups must work for.
type wakeMode struct {
	name string
	cfg  core.SubscriptionConfig
}

// wakeModes are clustering, orderly and broadcast subscriptions, each with
// a one-second retry delay.
func wakeModes() []wakeMode {
	delays := []time.Duration{time.Second}
	return []wakeMode{
		{"clustering", core.SubscriptionConfig{RetryDelays: delays}},
		{"orderly", core.SubscriptionConfig{Orderly: true, RetryDelays: delays}},
		{"broadcast", core.SubscriptionConfig{Mode: core.ModeBroadcast, RetryDelays: delays}},
	}
}

// eachWakeMode runs test once per mode, as a subtest in a synctest bubble
// (fake time: a 20 s wait costs nothing).
func eachWakeMode(t *testing.T, test func(t *testing.T, m wakeMode)) {
	for _, m := range wakeModes() {
		t.Run(m.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { test(t, m) })
		})
	}
}

// wakeEnv is a broker with topic "orders" (queues queues) and subscription
// "g" of the given mode. Every pull of a test names consumer c1, so the
// broadcast ones share one position.
type wakeEnv struct {
	*env
	t *testing.T
}

func newWakeEnv(t *testing.T, m wakeMode, queues int, opts core.Options) *wakeEnv {
	e := newEnv(t, opts)
	e.putTopic("orders", queues)
	e.subscribe("orders", "g", m.cfg)
	return &wakeEnv{env: e, t: t}
}

func (w *wakeEnv) send(bodies ...string) {
	w.t.Helper()
	msgs := make([]*core.Message, len(bodies))
	for i, b := range bodies {
		msgs[i] = &core.Message{Body: []byte(b), ShardingKey: "k"} // one key: one queue, and orderly holds it
	}
	w.sendBatch("orders", msgs...)
}

func (w *wakeEnv) pullNow(n int, invisible time.Duration) []core.Delivered {
	w.t.Helper()
	return w.pull("orders", "g", core.PullRequest{MaxMessages: n, Invisible: invisible, ConsumerID: "c1"})
}

func (w *wakeEnv) pullOne(invisible time.Duration) core.Delivered {
	w.t.Helper()
	got := w.pullNow(1, invisible)
	if len(got) != 1 {
		w.t.Fatalf("pull got %d messages, want 1", len(got))
	}
	return got[0]
}

func (w *wakeEnv) nack(d core.Delivered, delay time.Duration) {
	w.t.Helper()
	if n, failed, err := w.b.Nack(w.t.Context(), "orders", "g", []string{d.ReceiptHandle}, delay, "test"); n != 1 || len(failed) > 0 || err != nil {
		w.t.Fatalf("Nack = %d, %v, %v", n, failed, err)
	}
}

// deadLettered puts a message into the DLQ, so a redrive can bring it back.
func (w *wakeEnv) deadLettered(body string) {
	w.t.Helper()
	w.send(body)
	d := w.pullOne(0)
	if n, failed, err := w.b.DeadLetter(w.t.Context(), "orders", "g", []string{d.ReceiptHandle}, "test"); n != 1 || len(failed) > 0 || err != nil {
		w.t.Fatalf("DeadLetter = %d, %v, %v", n, failed, err)
	}
}

func (w *wakeEnv) redrive() {
	w.t.Helper()
	if n, err := w.b.Redrive(w.t.Context(), "orders", "g", core.RedriveFilter{}); n != 1 || err != nil {
		w.t.Fatalf("Redrive = %d, %v; want 1", n, err)
	}
}

// parkThen parks a pull with a 20 s wait, checks it is parked, runs act
// (which returns how long after it the message is ready) and checks the
// pull answers with want's bodies once the message is ready: not before,
// and not later than a second after.
func (w *wakeEnv) parkThen(act func() time.Duration, want ...string) []core.Delivered {
	w.t.Helper()
	ch := pullAsync(w.t.Context(), w.b, "orders", "g", core.PullRequest{Wait: wakeWait, ConsumerID: "c1", MaxMessages: len(want)})
	time.Sleep(wakeParked)
	synctest.Wait()
	select {
	case r := <-ch:
		w.t.Fatalf("pull answered after %v before the test acted: %d messages, %v", r.elapsed, len(r.got), r.err)
	default:
	}
	if n := w.b.ParkedPulls(); n != 1 {
		w.t.Fatalf("ParkedPulls = %d, want 1", n)
	}
	readyAt := wakeParked + act()
	r := <-ch
	if r.err != nil {
		w.t.Fatalf("parked pull: %v", r.err)
	}
	if got := bodies(r.got); !slices.Equal(got, want) {
		w.t.Errorf("parked pull got %v after %v, want %v", got, r.elapsed, want)
	}
	if r.elapsed < readyAt || r.elapsed >= readyAt+time.Second {
		w.t.Errorf("parked pull answered after %v; the message was ready after %v (the wait was %v)", r.elapsed, readyAt, wakeWait)
	}
	return r.got
}

// A nack's delay ending: on clustering and broadcast subscriptions the timer
// loop delivers the parked retry; on orderly ones the key's suspension ends.
func TestLongPollWakesWhenNackDelayEnds(t *testing.T) {
	eachWakeMode(t, func(t *testing.T, m wakeMode) {
		w := newWakeEnv(t, m, 2, core.Options{})
		w.send("m")
		d := w.pullOne(0)
		w.parkThen(func() time.Duration {
			w.nack(d, time.Second)
			return time.Second
		}, "m")
	})
}

// A retry's delay ending: the message is a parked retry already (a redriven
// one, which is a retry on every kind of subscription), nacked again.
func TestLongPollWakesWhenRetryDelayEnds(t *testing.T) {
	eachWakeMode(t, func(t *testing.T, m wakeMode) {
		w := newWakeEnv(t, m, 2, core.Options{})
		w.deadLettered("m")
		w.redrive()
		d := w.pullOne(0)
		w.parkThen(func() time.Duration {
			w.nack(d, 2*time.Second)
			return 2 * time.Second
		}, "m")
	})
}

// A lease running out makes the message available again; on orderly
// subscriptions its key is then suspended for the retry delay (1 s).
func TestLongPollWakesWhenLeaseRunsOut(t *testing.T) {
	for _, m := range wakeModes() {
		suspension := time.Duration(0)
		if m.cfg.Orderly {
			suspension = time.Second
		}
		t.Run(m.name+"/leased before parking", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWakeEnv(t, m, 2, core.Options{})
				w.send("m")
				w.pullOne(3 * time.Second)
				w.parkThen(func() time.Duration { return 2*time.Second + suspension }, "m")
			})
		})
		t.Run(m.name+"/lease shortened while parked", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWakeEnv(t, m, 2, core.Options{})
				w.send("m")
				d := w.pullOne(time.Hour)
				w.parkThen(func() time.Duration {
					n, failed, err := w.b.Extend(t.Context(), "orders", "g", []string{d.ReceiptHandle}, 2*time.Second)
					if n != 1 || len(failed) > 0 || err != nil {
						t.Fatalf("Extend = %d, %v, %v", n, failed, err)
					}
					return 2*time.Second + suspension
				}, "m")
			})
		})
	}
}

// An orderly key's suspension ending: the nacked message comes back first,
// with the key's next message behind it (its lease was revoked by the
// nack); then, once both are acked, the key's next one.
func TestLongPollWakesWhenOrderlyKeySuspensionEnds(t *testing.T) {
	m := wakeModes()[1]
	if !m.cfg.Orderly {
		t.Fatalf("mode %s is not orderly", m.name)
	}
	synctest.Test(t, func(t *testing.T) {
		w := newWakeEnv(t, m, 2, core.Options{})
		w.send("m1", "m2")
		first := w.pullNow(10, 0)
		if got := order(first); !slices.Equal(got, []string{"m1", "m2"}) {
			t.Fatalf("first pull got %v, want [m1 m2]", got)
		}
		again := w.parkThen(func() time.Duration {
			w.nack(first[0], 3*time.Second)
			return 3 * time.Second
		}, "m1", "m2")
		if len(again) != 2 || again[0].Attempt != 2 || again[1].Attempt != 1 {
			t.Fatalf("parked pull got %+v, want m1 with attempt 2, m2 with attempt 1", again)
		}
		w.send("m3")
		w.parkThen(func() time.Duration {
			w.ackAll("orders", "g", again)
			return 0
		}, "m3")
	})
}

// A delayed message coming due, sent before the pull parks and while it is
// parked.
func TestLongPollWakesWhenDelayedMessageComesDue(t *testing.T) {
	for _, m := range wakeModes() {
		t.Run(m.name+"/sent while parked", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWakeEnv(t, m, 2, core.Options{})
				w.pullNow(1, 0) // a broadcast consumer's position starts at its first pull
				w.parkThen(func() time.Duration {
					due := time.Now().Add(2 * time.Second)
					w.sendBatch("orders", &core.Message{Body: []byte("later"), DeliverAtMs: due.UnixMilli()})
					return 2 * time.Second
				}, "later")
			})
		})
		t.Run(m.name+"/sent before parking", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				w := newWakeEnv(t, m, 2, core.Options{})
				w.pullNow(1, 0)
				due := time.Now().Add(3 * time.Second)
				w.sendBatch("orders", &core.Message{Body: []byte("later"), DeliverAtMs: due.UnixMilli()})
				w.parkThen(func() time.Duration { return 2 * time.Second }, "later")
			})
		})
	}
}

// A redrive brings a dead message back at once.
func TestLongPollWakesOnRedrive(t *testing.T) {
	eachWakeMode(t, func(t *testing.T, m wakeMode) {
		w := newWakeEnv(t, m, 2, core.Options{})
		w.deadLettered("m")
		w.parkThen(func() time.Duration {
			w.redrive()
			return 0
		}, "m")
	})
}

// A seek back to the earliest message delivers acked messages again at once.
func TestLongPollWakesOnSeek(t *testing.T) {
	eachWakeMode(t, func(t *testing.T, m wakeMode) {
		w := newWakeEnv(t, m, 2, core.Options{})
		w.send("m")
		w.ackAll("orders", "g", []core.Delivered{w.pullOne(0)})
		w.parkThen(func() time.Duration {
			consumer := ""
			if m.cfg.Mode == core.ModeBroadcast {
				consumer = "c1"
			}
			if _, err := w.b.Seek(t.Context(), "orders", "g", "earliest", consumer, false); err != nil {
				t.Fatalf("Seek: %v", err)
			}
			return 0
		}, "m")
	})
}

// An ack that frees a lease slot (MaxLeasesPerQueue) makes the queue's next
// message available at once.
func TestLongPollWakesWhenLeaseSlotFrees(t *testing.T) {
	eachWakeMode(t, func(t *testing.T, m wakeMode) {
		w := newWakeEnv(t, m, 1, core.Options{MaxLeasesPerQueue: 1})
		w.sendBatch("orders", &core.Message{Body: []byte("m1"), ShardingKey: "a"}, &core.Message{Body: []byte("m2"), ShardingKey: "b"})
		d := w.pullOne(0)
		if string(d.Message.Body) != "m1" {
			t.Fatalf("first pull got %q, want m1", d.Message.Body)
		}
		w.parkThen(func() time.Duration {
			w.ackAll("orders", "g", []core.Delivered{d})
			return 0
		}, "m2")
	})
}

// The wake-up timer firing with nothing ready (the lease it was armed for
// was acked) leaves the parked pull waiting out its wait.
func TestLongPollWakeWithNothingReadyKeepsWaiting(t *testing.T) {
	eachWakeMode(t, func(t *testing.T, m wakeMode) {
		w := newWakeEnv(t, m, 2, core.Options{})
		w.send("m")
		d := w.pullOne(3 * time.Second)
		ch := pullAsync(t.Context(), w.b, "orders", "g", core.PullRequest{Wait: wakeWait, ConsumerID: "c1"})
		time.Sleep(wakeParked)
		synctest.Wait()
		w.ackAll("orders", "g", []core.Delivered{d})
		r := <-ch
		if r.err != nil || len(r.got) != 0 || r.elapsed != wakeWait {
			t.Errorf("parked pull = %d messages, %v, after %v; want none after its whole %v wait", len(r.got), r.err, r.elapsed, wakeWait)
		}
	})
}

// Deleting a subscription and closing the broker disarm the wake-up timers.
func TestWakeTimerStopsWithSubscriptionAndBroker(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "deleted", core.SubscriptionConfig{})
	e.subscribe("orders", "closed", core.SubscriptionConfig{})
	e.send("orders", "m")
	probes := map[string]func() (bool, bool){}
	for _, g := range []string{"deleted", "closed"} {
		probes[g] = core.WakeTimerOf(e.b, "orders", g)
		if got := e.pull("orders", g, core.PullRequest{Invisible: time.Hour}); len(got) != 1 {
			t.Fatalf("pull from %s got %d messages", g, len(got))
		}
	}
	if err := e.b.DeleteSubscription(t.Context(), "orders", "deleted"); err != nil {
		t.Fatal(err)
	}
	if armed, pending := probes["deleted"](); armed || pending {
		t.Errorf("deleted subscription: timer armed %t, pending %t; want neither", armed, pending)
	}
	e.close()
	if armed, pending := probes["closed"](); armed || pending {
		t.Errorf("after Close: timer armed %t, pending %t; want neither", armed, pending)
	}
}
