package core_test

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

var rebuildSeed = flag.Uint64("rebuild.seed", 0, "replay TestRebuiltBrokerEqualsRunning with this seed (also TIDEMQ_REBUILD_SEED)")

// rebuildSeeds are the seeds to run: the one asked for, or a few fixed ones.
func rebuildSeeds(t *testing.T) []uint64 {
	if *rebuildSeed != 0 {
		return []uint64{*rebuildSeed}
	}
	if v := os.Getenv("TIDEMQ_REBUILD_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TIDEMQ_REBUILD_SEED=%q: %v", v, err)
		}
		return []uint64{seed}
	}
	if core.RaceEnabled || testing.Short() {
		// The race detector makes a run several times slower.
		return []uint64{1, 2}
	}
	return []uint64{1, 2, 3, 4, 5, 6}
}

// TestRebuiltBrokerEqualsRunning runs a randomized workload and, at random
// points, rebuilds a broker from a crash copy of the store and compares
// its logical state with the running broker's, the lag it reports included
// (leases, which are memory only, are not compared: only what they hold).
func TestRebuiltBrokerEqualsRunning(t *testing.T) {
	for _, seed := range rebuildSeeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Logf("seed %d (replay with -rebuild.seed=%d)", seed, seed)
			newRebuildWorkload(t, seed).run(1500)
		})
	}
}

// A deterministic check that the comparison sees what it must: a rebuilt
// broker one send behind, and a changed attempt count.
func TestDiffStatesNamesDifferences(t *testing.T) {
	fs := vfs.NewCrashableMem()
	clk := newClock()
	opts := rebuildOptions(clk)
	store, b := openRebuildBroker(t, fs, opts)
	defer closeRebuildBroker(t, store, b)
	ctx := t.Context()
	if _, _, err := b.PutTopic(ctx, "orders", core.TopicConfig{Queues: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.PutSubscription(ctx, "orders", "g", core.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Send(ctx, "orders", []*core.Message{{Body: []byte("a")}}); err != nil {
		t.Fatal(err)
	}
	behind := fs.CrashClone(vfs.CrashCloneCfg{})
	if _, err := b.Send(ctx, "orders", []*core.Message{{Body: []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	nowMs := clk.Now().UnixMilli()
	running, err := core.LogicalState(b, nowMs)
	if err != nil {
		t.Fatal(err)
	}
	if d := core.DiffStates(running, running); len(d) != 0 {
		t.Fatalf("a state differs from itself: %v", d)
	}
	rs, rb := openRebuildBroker(t, behind, opts)
	rebuilt, err := core.LogicalState(rb, nowMs)
	closeRebuildBroker(t, rs, rb)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"counters/nextSeq: 2 vs 1",
		"sub orders/g/cursor 1/queue 0/pending offset 1: pending vs -",
		"sub orders/g/lag: 2 vs 1",
		"sub orders/g/queue 0 lag: 2 vs 1",
		"topic orders/queue 0/bytes: 2 vs 1",
		"topic orders/queue 0/next: 2 vs 1",
	}
	if diffs := core.DiffStates(running, rebuilt); !slices.Equal(diffs, want) {
		t.Errorf("DiffStates of a broker one send behind:\n%s\nwant:\n%s", strings.Join(diffs, "\n"), strings.Join(want, "\n"))
	}

	changed := running
	changed.Subs = slices.Clone(running.Subs)
	cur := changed.Subs[0].Cursors[0]
	q := cur.Queues[0]
	q.Pending = slices.Clone(q.Pending)
	q.Pending[0].Attempts++
	cur.Queues = []core.SubQueueState{q}
	changed.Subs[0].Cursors = []core.CursorState{cur}
	want = []string{"sub orders/g/cursor 1/queue 0/pending offset 0 attempts: 0 vs 1"}
	if d := core.DiffStates(running, changed); !slices.Equal(d, want) {
		t.Errorf("DiffStates after one attempt more = %v, want %v", d, want)
	}

	// A subscription one side lacks is named once, not field by field.
	gone := running
	gone.Subs = nil
	d := core.DiffStates(running, gone)
	if len(d) != 1 || !strings.HasPrefix(d[0], "sub orders/g: {") || !strings.HasSuffix(d[0], "} vs -") {
		t.Errorf("DiffStates without the subscription = %v, want one difference naming sub orders/g", d)
	}
}

func rebuildOptions(clk *clock) core.Options {
	return core.Options{Logger: quiet, Now: clk.Now, ReceiptKey: []byte("rebuild-test-receipt-key")}
}

func openRebuildBroker(t *testing.T, fs vfs.FS, opts core.Options) (*pebblestore.Store, *core.Broker) {
	t.Helper()
	store, err := pebblestore.Open("db", pebblestore.Options{FS: fs, Logger: quiet, CacheBytes: 8 << 20, MemTableBytes: 4 << 20})
	if err != nil {
		t.Fatalf("pebblestore.Open: %v", err)
	}
	b, err := core.New(store, opts)
	if err != nil {
		_ = store.Close()
		t.Fatalf("core.New: %v", err)
	}
	return store, b
}

func closeRebuildBroker(t *testing.T, store *pebblestore.Store, b *core.Broker) {
	t.Helper()
	if err := b.Close(); err != nil {
		t.Errorf("broker Close: %v", err)
	}
	if err := store.Close(); err != nil {
		t.Errorf("store Close: %v", err)
	}
}

// rebuildWorkload drives one broker from one goroutine.
type rebuildWorkload struct {
	t     *testing.T
	seed  uint64
	rng   *rand.Rand
	clk   *clock
	fs    *vfs.MemFS
	opts  core.Options
	store *pebblestore.Store
	b     *core.Broker
	held  []heldLease
	step  int
	// compared counts the comparisons made; diffs the differences found.
	compared int
	diffs    []string
	// ops counts the calls made, by outcome, to show what a seed exercised.
	ops map[string]int
	// covered counts the comparisons whose running state held each kind
	// of state, to show what was compared.
	covered map[string]int
}

type heldLease struct {
	topic, group, handle string
}

var (
	rebuildTopics = []string{"orders", "events", "audit"}
	rebuildGroups = []struct {
		name string
		cfg  func(r *rand.Rand) core.SubscriptionConfig
	}{
		{"workers", func(r *rand.Rand) core.SubscriptionConfig {
			return core.SubscriptionConfig{MaxRetries: ptr(r.IntN(3)), RetryDelays: smallDelays(r)}
		}},
		{"tagged", func(r *rand.Rand) core.SubscriptionConfig {
			filters := []string{"A", "A || B", "C", "*"}
			return core.SubscriptionConfig{Filter: filters[r.IntN(len(filters))], MaxRetries: ptr(1 + r.IntN(2)), RetryDelays: smallDelays(r)}
		}},
		{"fanout", func(r *rand.Rand) core.SubscriptionConfig {
			return core.SubscriptionConfig{Mode: core.ModeBroadcast, MaxRetries: ptr(r.IntN(3)), RetryDelays: smallDelays(r)}
		}},
		{"ordered", func(r *rand.Rand) core.SubscriptionConfig {
			return core.SubscriptionConfig{Orderly: true, MaxRetries: ptr(1 + r.IntN(3)), RetryDelays: smallDelays(r)}
		}},
		{"late", func(r *rand.Rand) core.SubscriptionConfig {
			return core.SubscriptionConfig{StartFrom: "latest", MaxRetries: ptr(r.IntN(2)), RetryDelays: smallDelays(r)}
		}},
	}
	rebuildConsumers = []string{"c1", "c2", "c3"}
	rebuildTags      = []string{"", "A", "B", "C"}
	rebuildKeys      = []string{"", "k1", "k2", "k3", "k4"}
)

func ptr[T any](v T) *T { return &v }

func smallDelays(r *rand.Rand) []time.Duration {
	n := 1 + r.IntN(3)
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(r.IntN(3000)) * time.Millisecond
	}
	return out
}

func newRebuildWorkload(t *testing.T, seed uint64) *rebuildWorkload {
	clk := newClock()
	w := &rebuildWorkload{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		clk: clk, fs: vfs.NewCrashableMem(), opts: rebuildOptions(clk), ops: map[string]int{}, covered: map[string]int{},
	}
	w.store, w.b = openRebuildBroker(t, w.fs, w.opts)
	t.Cleanup(func() { closeRebuildBroker(t, w.store, w.b) })
	return w
}

func (w *rebuildWorkload) run(steps int) {
	next := 5 + w.rng.IntN(36)
	for w.step = 1; w.step <= steps; w.step++ {
		w.once()
		if w.t.Failed() {
			return
		}
		if w.step == next || w.step == steps {
			w.compare()
			next = w.step + 5 + w.rng.IntN(36)
		}
	}
	w.t.Logf("calls: %v", w.ops)
	w.t.Logf("comparisons: %d, holding: %v", w.compared, w.covered)
	if len(w.diffs) > 0 {
		w.t.Errorf("seed %d: a rebuilt broker differs from the running one (%d comparisons):\n%s",
			w.seed, w.compared, strings.Join(w.diffs, "\n"))
	}
}

// expectedErr reports whether err is one a random workload meets: things
// deleted meanwhile, spent handles, conflicts.
func expectedErr(err error) bool {
	if err == nil {
		return true
	}
	var ve *core.ValidationError
	return errors.Is(err, core.ErrTopicNotFound) || errors.Is(err, core.ErrSubscriptionNotFound) ||
		errors.Is(err, core.ErrModeConflict) || errors.Is(err, core.ErrReceiptExpired) ||
		errors.Is(err, core.ErrReceiptInvalid) || errors.As(err, &ve)
}

func (w *rebuildWorkload) check(op string, err error) {
	if err == nil {
		w.ops[op]++
	} else {
		w.ops[op+" (refused)"]++
	}
	if !expectedErr(err) {
		w.t.Fatalf("seed %d step %d: %s: %v", w.seed, w.step, op, err)
	}
}

func (w *rebuildWorkload) pick(xs []string) string { return xs[w.rng.IntN(len(xs))] }

// existing picks a topic and subscription that exist, most of the time:
// calls on missing ones are refused and exercise nothing else.
func (w *rebuildWorkload) existing(topic, group string) (string, string) {
	if w.rng.IntN(10) == 0 {
		return topic, group
	}
	var subs [][2]string
	for _, t := range w.b.ListTopics() {
		for _, g := range t.Subscriptions {
			subs = append(subs, [2]string{t.Name, g})
		}
	}
	if len(subs) == 0 {
		return topic, group
	}
	p := subs[w.rng.IntN(len(subs))]
	return p[0], p[1]
}

func (w *rebuildWorkload) once() {
	ctx := w.t.Context()
	r := w.rng
	topic := w.pick(rebuildTopics)
	g := rebuildGroups[r.IntN(len(rebuildGroups))]
	group := g.name
	switch n := r.IntN(100); {
	case n < 6: // create a topic, or grow its queues
		queues := 1 + r.IntN(2)
		if info, err := w.b.GetTopic(topic); err == nil {
			queues = min(info.Queues+r.IntN(2), 4)
		}
		_, _, err := w.b.PutTopic(ctx, topic, core.TopicConfig{Queues: queues, RetentionHours: 1})
		w.check("PutTopic", err)
	case n < 7:
		if r.IntN(3) == 0 {
			w.check("DeleteTopic", w.b.DeleteTopic(ctx, topic))
		}
	case n < 13: // create or update a subscription
		_, _, err := w.b.PutSubscription(ctx, topic, g.name, g.cfg(r))
		w.check("PutSubscription", err)
	case n < 14:
		if r.IntN(2) == 0 {
			topic, group := w.existing(topic, group)
			w.check("DeleteSubscription", w.b.DeleteSubscription(ctx, topic, group))
		}
	case n < 32:
		_, err := w.b.Send(ctx, topic, []*core.Message{w.message()})
		w.check("Send", err)
	case n < 38:
		msgs := make([]*core.Message, 2+r.IntN(5))
		for i := range msgs {
			msgs[i] = w.message()
		}
		_, err := w.b.Send(ctx, topic, msgs)
		w.check("Send batch", err)
	case n < 56:
		topic, group := w.existing(topic, group)
		req := core.PullRequest{MaxMessages: 1 + r.IntN(5), Invisible: time.Duration(1+r.IntN(3)) * time.Second}
		if group == "fanout" {
			req.ConsumerID = w.pick(rebuildConsumers)
		}
		got, err := w.b.Pull(ctx, topic, group, req)
		w.check("Pull", err)
		w.ops["delivered"] += len(got)
		for _, d := range got {
			w.held = append(w.held, heldLease{topic, group, d.ReceiptHandle})
		}
	case n < 66:
		w.settle("Ack", func(l heldLease, hs []string) error {
			_, _, err := w.b.Ack(ctx, l.topic, l.group, hs)
			return err
		})
	case n < 73:
		delay := time.Duration(-1)
		if r.IntN(2) == 0 {
			delay = time.Duration(r.IntN(3000)) * time.Millisecond
		}
		w.settle("Nack", func(l heldLease, hs []string) error {
			_, _, err := w.b.Nack(ctx, l.topic, l.group, hs, delay, "nacked")
			return err
		})
	case n < 75:
		w.settle("DeadLetter", func(l heldLease, hs []string) error {
			_, _, err := w.b.DeadLetter(ctx, l.topic, l.group, hs, "dead")
			return err
		})
	case n < 78:
		w.settle("Extend", func(l heldLease, hs []string) error {
			_, _, err := w.b.Extend(ctx, l.topic, l.group, hs, time.Duration(1+r.IntN(3))*time.Second)
			return err
		})
	case n < 80:
		topic, group := w.existing(topic, group)
		_, err := w.b.Redrive(ctx, topic, group, core.RedriveFilter{DryRun: r.IntN(4) == 0})
		w.check("Redrive", err)
	case n < 82:
		to := []string{"earliest", "latest", w.clk.Now().Add(-time.Duration(r.IntN(20)) * time.Second).Format(time.RFC3339Nano)}[r.IntN(3)]
		topic, group := w.existing(topic, group)
		consumer := ""
		if group == "fanout" {
			consumer = w.pick(rebuildConsumers)
		}
		_, err := w.b.Seek(ctx, topic, group, to, consumer, false)
		w.check("Seek", err)
	case n < 85: // a transaction: prepared, or one settled
		w.transaction(topic)
	case n < 97:
		w.clk.Advance(time.Duration(100+r.IntN(4000)) * time.Millisecond)
	case n < 98: // past the retention of every message stored so far
		w.clk.Advance(61 * time.Minute)
		w.check("EnforceRetention", w.b.EnforceRetention())
	default:
		w.check("EnforceRetention", w.b.EnforceRetention())
	}
}

// transaction prepares half messages on topic, or commits or rolls back
// one of its open transactions. Checks come after 10 minutes (the clock
// jumps past them now and then; with no checker they fail, and are
// recorded).
func (w *rebuildWorkload) transaction(topic string) {
	ctx := w.t.Context()
	txs, err := w.b.ListTransactions(topic)
	if err != nil || len(txs) == 0 || w.rng.IntN(2) == 0 {
		msgs := make([]*core.Message, 1+w.rng.IntN(2))
		for i := range msgs {
			msgs[i] = w.message()
			msgs[i].DedupKey = ""
		}
		_, _, err := w.b.SendTransaction(ctx, topic, msgs, 10*time.Minute)
		w.check("SendTransaction", err)
		return
	}
	tx := txs[w.rng.IntN(len(txs))]
	if w.rng.IntN(2) == 0 {
		_, err = w.b.CommitTransaction(ctx, topic, tx.TransactionID)
		w.check("CommitTransaction", err)
	} else {
		_, err = w.b.RollbackTransaction(ctx, topic, tx.TransactionID)
		w.check("RollbackTransaction", err)
	}
}

func (w *rebuildWorkload) message() *core.Message {
	r := w.rng
	m := &core.Message{Body: fmt.Appendf(nil, "m%d", w.step), Tag: w.pick(rebuildTags), ShardingKey: w.pick(rebuildKeys)}
	if r.IntN(5) == 0 {
		m.DedupKey = fmt.Sprintf("d%d", r.IntN(6))
	}
	if r.IntN(6) == 0 {
		m.DeliverAtMs = w.clk.Now().Add(time.Duration(1+r.IntN(5000)) * time.Millisecond).UnixMilli()
	}
	return m
}

// settle takes 1-3 held handles of one subscription and settles them.
func (w *rebuildWorkload) settle(op string, fn func(heldLease, []string) error) {
	if len(w.held) == 0 {
		return
	}
	first := w.held[w.rng.IntN(len(w.held))]
	var hs []string
	kept := w.held[:0]
	for _, l := range w.held {
		if len(hs) < 1+w.rng.IntN(3) && l.topic == first.topic && l.group == first.group {
			hs = append(hs, l.handle)
			continue
		}
		kept = append(kept, l)
	}
	w.held = kept
	// A spent handle stays around sometimes, to be settled again.
	if w.rng.IntN(4) == 0 {
		w.held = append(w.held, heldLease{first.topic, first.group, hs[0]})
	}
	w.check(op, fn(first, hs))
}

// quiesce settles what is due at the frozen clock and makes every queued
// write durable, then reads the running state; it tries again (bounded)
// while a background loop still changes it.
func (w *rebuildWorkload) quiesce() (core.State, vfs.FS) {
	nowMs := w.clk.Now().UnixMilli()
	for try := 0; ; try++ {
		if err := w.b.EnforceRetention(); err != nil {
			w.t.Fatalf("EnforceRetention: %v", err)
		}
		core.SettleDue(w.b)
		if err := core.Flush(w.b); err != nil {
			w.t.Fatalf("Flush: %v", err)
		}
		before, err := core.LogicalState(w.b, nowMs)
		if err != nil {
			w.t.Fatalf("LogicalState: %v", err)
		}
		clone := w.fs.CrashClone(vfs.CrashCloneCfg{})
		after, err := core.LogicalState(w.b, nowMs)
		if err != nil {
			w.t.Fatalf("LogicalState: %v", err)
		}
		d := core.DiffStates(before, after)
		if len(d) == 0 {
			return before, clone
		}
		w.ops["quiesce again"]++
		if try == 5 {
			w.t.Fatalf("seed %d step %d: the running broker kept changing with the clock frozen:\n%s", w.seed, w.step, strings.Join(d, "\n"))
		}
	}
}

func (w *rebuildWorkload) compare() {
	w.compared++
	running, clone := w.quiesce()
	nowMs := w.clk.Now().UnixMilli()
	// The rebuilt broker's loops start in New; with the clock frozen and
	// everything due settled they find nothing to do, but its state is
	// read at once all the same.
	store, rb := openRebuildBroker(w.t, clone, w.opts)
	rebuilt, err := core.LogicalState(rb, nowMs)
	closeRebuildBroker(w.t, store, rb)
	if err != nil {
		w.t.Fatalf("LogicalState of the rebuilt broker: %v", err)
	}
	w.noteCoverage(running)
	for _, d := range core.DiffStates(running, rebuilt) {
		w.diffs = append(w.diffs, fmt.Sprintf("step %d: %s", w.step, d))
	}
}

// noteCoverage counts which kinds of state a compared running state held.
func (w *rebuildWorkload) noteCoverage(st core.State) {
	seen := map[string]bool{"dedup": len(st.Dedup) > 0, "delayed": len(st.Delayed) > 0, "transactions": len(st.Transactions) > 0}
	for _, t := range st.Topics {
		for _, q := range t.Queues {
			seen["retention cut"] = seen["retention cut"] || q.Min > 0
		}
	}
	for _, s := range st.Subs {
		seen["dlq"] = seen["dlq"] || s.NDead > 0
		seen["members"] = seen["members"] || len(s.Members) > 0
		for _, c := range s.Cursors {
			for _, r := range c.Retries {
				seen["retry"] = true
				seen["retry waiting"] = seen["retry waiting"] || r.DueMs > 0
			}
			for _, q := range c.Queues {
				for _, p := range q.Pending {
					seen["pending"] = true
					seen["pending attempted"] = seen["pending attempted"] || p.Attempts > 0
					seen["suspended"] = seen["suspended"] || p.SuspendedUntil > 0
				}
			}
		}
	}
	for k, ok := range seen {
		if ok {
			w.covered[k]++
		}
	}
}
