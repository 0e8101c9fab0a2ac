package pebblestore_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// The write path a replica follows: every commit of a broker is a batch
// whose bytes (core.Batch.Repr) another store applies (Store.ApplyBatch),
// and a crash keeps exactly the synced commits. Fingerprints compare the
// stores' whole contents.

// observer is a core.Proposer that commits through inner and hands each
// committed batch's bytes to after. The broker proposes from one goroutine
// at a time, so after runs with no other commit in flight.
type observer struct {
	inner core.Proposer
	mu    sync.Mutex
	n     int // batches committed
	after func(n int, repr []byte)
}

func (o *observer) Propose(b core.Batch, alone bool) error {
	// Pebble reuses the bytes once the batch is committed.
	repr := bytes.Clone(b.Repr())
	if err := o.inner.Propose(b, alone); err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n++
	o.after(o.n, repr)
	return nil
}

type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var replicaQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// openObservedBroker opens a store on fs and a broker over it that commits
// through p; the broker is closed before the store when the test ends.
func openObservedBroker(t *testing.T, fs vfs.FS, clk *testClock, p core.Proposer) (*core.Broker, *pebblestore.Store) {
	t.Helper()
	store := openStore(t, fs, "db")
	b, err := core.New(store, core.Options{Now: clk.Now, Logger: replicaQuiet, ReceiptKey: []byte("replica-test-key"), Proposer: p})
	if err != nil {
		t.Fatalf("core.New: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("broker Close: %v", err)
		}
	})
	return b, store
}

func fingerprint(t *testing.T, s *pebblestore.Store) [32]byte {
	t.Helper()
	fp, err := s.Fingerprint()
	if err != nil {
		t.Fatal(err)
	}
	return fp
}

// fingerprintOff is fingerprint for the broker's goroutines, which must not
// stop the test: a failure counts as an error and a zero fingerprint.
func fingerprintOff(t *testing.T, s *pebblestore.Store) [32]byte {
	t.Helper()
	fp, err := s.Fingerprint()
	if err != nil {
		t.Errorf("Fingerprint: %v", err)
	}
	return fp
}

// flushAt flushes s's memtable on every every-th commit n.
func flushAt(t *testing.T, s *pebblestore.Store, n, every int) {
	t.Helper()
	if n%every == 0 {
		if err := s.Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
	}
}

// workloadCounts is what a workload did, so a test knows its commits
// covered each kind of write.
type workloadCounts struct {
	sent, deduped, delayedDue, acked, nacked, dead, redriven, expired, seeks, retained int
	mirrored, mirrorSkipped                                                            int
	// Transactions: prepared, committed, rolled back by request (the
	// rest are left to their checks, which fail: no checker).
	prepared, committed, rolledBack int
}

// runWorkload drives b through the core API: topics of several queues,
// sends with keys, tags, sharding keys, dedup keys and delays, clustering,
// broadcast and orderly subscriptions, pulls, acks, nacks with a delay,
// dead letters, lease expiries, redrive, seek, retention, mirrors (copies
// with their skip records, repeats skipped, watermark raises), updates and
// deletes. Choices come from seed; the clock moves only here.
func runWorkload(t *testing.T, b *core.Broker, clk *testClock, seed uint64, rounds int) workloadCounts {
	t.Helper()
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(seed, 7))
	// Transactions draw from their own source, so the rest of the
	// workload makes the same choices as without them.
	txRng := rand.New(rand.NewPCG(seed, 11))
	var c workloadCounts
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	putTopic := func(name string, cfg core.TopicConfig) {
		_, _, err := b.PutTopic(ctx, name, cfg)
		must("PutTopic "+name, err)
	}
	putSub := func(topic, group string, cfg core.SubscriptionConfig) {
		_, _, err := b.PutSubscription(ctx, topic, group, cfg)
		must("PutSubscription "+topic+"/"+group, err)
	}
	one, two := 1, 2
	putTopic("orders", core.TopicConfig{Queues: 4, RetentionHours: 1})
	putTopic("events", core.TopicConfig{Queues: 2})
	putTopic("poke", core.TopicConfig{Queues: 1})
	// Transactions on a topic of their own, so that orders' queues get
	// the same messages as without them.
	checkURL := "http://127.0.0.1:1/check"
	putTopic("payments", core.TopicConfig{Queues: 2, RetentionHours: 1, TransactionCheckURL: &checkURL, TransactionMaxChecks: 2})
	putSub("payments", "ledger", core.SubscriptionConfig{Filter: "red || blue"})
	putSub("orders", "workers", core.SubscriptionConfig{MaxRetries: &one, RetryDelays: []time.Duration{time.Second}})
	putSub("orders", "audit", core.SubscriptionConfig{Mode: core.ModeBroadcast, Filter: "red || blue"})
	putSub("events", "seq", core.SubscriptionConfig{Orderly: true, MaxRetries: &two, RetryDelays: []time.Duration{2 * time.Second}})
	putSub("poke", "poke", core.SubscriptionConfig{})
	putTopic("copies", core.TopicConfig{Queues: 2})
	putMirror := func(name, filter string) {
		_, _, err := b.PutMirror(ctx, name, core.MirrorConfig{Source: core.MirrorSource{URL: "http://hz.example", Topic: "orders", Token: "t"},
			Topic: "copies", Filter: filter})
		must("PutMirror "+name, err)
	}
	putMirror("from-hz", "*")
	putMirror("from-sg", "*")
	// mirrorOffsets are a source queue's next offsets, handed out out of
	// order (as an orderly subscription does across keys) and sometimes
	// twice (a redelivery).
	mirrorNext := uint64(0)
	// The mirror's choices have a generator of their own, so the rest of
	// the workload makes the choices it made without mirrors.
	mrng := rand.New(rand.NewPCG(seed, 11))
	// A nack, even of a handle that names nothing, wakes the timer loop,
	// which reads the injected clock only when it wakes.
	poke := func() {
		_, _, err := b.Nack(ctx, "poke", "poke", []string{"poke"}, -1, "")
		must("poke", err)
	}
	// advance moves the clock and waits until the timer loop has fired a
	// marker due then, so every timer due by then has fired too.
	marker := 0
	advance := func(d time.Duration) {
		t.Helper()
		marker++
		due := clk.Now().Add(d)
		_, err := b.Send(ctx, "poke", []*core.Message{{Body: fmt.Appendf(nil, "marker-%d", marker), DeliverAtMs: due.UnixMilli()}})
		must("marker", err)
		clk.Advance(d)
		deadline := time.Now().Add(10 * time.Second)
		for wait := time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
			poke()
			info, err := b.GetTopic("poke")
			must("GetTopic poke", err)
			if info.Messages >= int64(marker) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the timer loop did not fire the marker due at %v", due)
			}
			time.Sleep(wait)
		}
	}
	tags := []string{"red", "blue", "green", ""}
	pull := func(topic, group, consumer string, invisible time.Duration) []core.Delivered {
		t.Helper()
		got, err := b.Pull(ctx, topic, group, core.PullRequest{MaxMessages: 6, Invisible: invisible, ConsumerID: consumer})
		must("Pull "+topic+"/"+group, err)
		return got
	}
	settle := func(topic, group string, ds []core.Delivered, orderly bool) {
		t.Helper()
		for _, d := range ds {
			if bytes.HasPrefix(d.Message.Body, []byte("delayed-")) {
				c.delayedDue++
			}
			h := []string{d.ReceiptHandle}
			var err error
			switch r := rng.IntN(10); {
			case r < 5:
				var n int
				n, _, err = b.Ack(ctx, topic, group, h)
				c.acked += n
			case r < 7:
				var n int
				n, _, err = b.Nack(ctx, topic, group, h, time.Second, "try later")
				c.nacked += n
			case r < 8 && !orderly:
				var n int
				n, _, err = b.DeadLetter(ctx, topic, group, h, "poison")
				c.dead += n
			default:
				c.expired++ // left to its lease, which expires
			}
			must("settle", err)
		}
	}
	for round := range rounds {
		var msgs []*core.Message
		for i := range 1 + rng.IntN(8) {
			m := &core.Message{
				Body: fmt.Appendf(nil, "r%d-m%d", round, i),
				Tag:  tags[rng.IntN(len(tags))],
				Keys: []string{fmt.Sprintf("key-%d", rng.IntN(20))},
			}
			if rng.IntN(3) == 0 {
				m.ShardingKey = fmt.Sprintf("shard-%d", rng.IntN(5))
			}
			if rng.IntN(4) == 0 {
				m.DedupKey = fmt.Sprintf("dedup-%d", rng.IntN(12))
			}
			if rng.IntN(5) == 0 {
				m.Body = fmt.Appendf(nil, "delayed-r%d-m%d", round, i)
				m.DeliverAtMs = clk.Now().Add(time.Duration(1+rng.IntN(3)) * time.Second).UnixMilli()
			}
			if rng.IntN(6) == 0 {
				m.Properties = map[string]string{"p": "v", "round": fmt.Sprint(round)}
			}
			msgs = append(msgs, m)
		}
		if txRng.IntN(3) == 0 {
			half := []*core.Message{{Body: fmt.Appendf(nil, "half-r%d", round), Tag: tags[txRng.IntN(len(tags))]}}
			if txRng.IntN(2) == 0 {
				half = append(half, &core.Message{Body: fmt.Appendf(nil, "half-r%d-b", round), ShardingKey: "shard-1",
					DeliverAtMs: clk.Now().Add(time.Second).UnixMilli()})
			}
			_, txID, err := b.SendTransaction(ctx, "payments", half, time.Second)
			must("SendTransaction", err)
			c.prepared++
			switch txRng.IntN(3) {
			case 0:
				_, err = b.CommitTransaction(ctx, "payments", txID)
				must("CommitTransaction", err)
				c.committed++
			case 1:
				_, err = b.RollbackTransaction(ctx, "payments", txID)
				must("RollbackTransaction", err)
				c.rolledBack++
			}
		}
		res, err := b.Send(ctx, "orders", msgs)
		must("Send orders", err)
		for _, r := range res {
			if r.Duplicate {
				c.deduped++
			}
		}
		c.sent += len(msgs)
		var events []*core.Message
		for i := range 1 + rng.IntN(4) {
			events = append(events, &core.Message{Body: fmt.Appendf(nil, "e%d-%d", round, i), ShardingKey: fmt.Sprintf("acct-%d", rng.IntN(3))})
		}
		_, err = b.Send(ctx, "events", events)
		must("Send events", err)

		var copies []core.MirrorCopy
		for i := range 1 + mrng.IntN(5) {
			q := uint32(mrng.IntN(2))
			off := mirrorNext + uint64(mrng.IntN(6))
			if mrng.IntN(4) == 0 && mirrorNext > 0 {
				off = uint64(mrng.IntN(int(mirrorNext))) // a repeat, mostly skipped
			}
			cp := core.MirrorCopy{SourceQueue: q, SourceOff: off}
			if mrng.IntN(5) > 0 {
				cp.Msg = &core.Message{Body: fmt.Appendf(nil, "copy-r%d-%d", round, i), ShardingKey: fmt.Sprintf("k%d", mrng.IntN(3)),
					Properties: map[string]string{core.PropMirrorPath: "hz", core.PropMirrorSourceMessageID: fmt.Sprintf("src-%d-%d", q, off)},
					DedupKey:   fmt.Sprintf("src-%d-%d", q, off), BornAtMs: clk.Now().Add(-time.Minute).UnixMilli()}
			}
			copies = append(copies, cp)
		}
		mirrorNext += 4
		n, err := b.SendMirrored(ctx, "from-hz", copies)
		must("SendMirrored", err)
		c.mirrored += n
		c.mirrorSkipped += len(copies) - n
		if round%4 == 3 {
			must("RaiseMirrorWatermarks", b.RaiseMirrorWatermarks(ctx, "from-hz", map[uint32]uint64{0: mirrorNext - 8, 1: mirrorNext - 4}))
		}

		settle("orders", "workers", pull("orders", "workers", "", 2*time.Second), false)
		for _, consumer := range []string{"c1", "c2"} {
			settle("orders", "audit", pull("orders", "audit", consumer, 2*time.Second), false)
		}
		settle("events", "seq", pull("events", "seq", "", 3*time.Second), true)

		if round%3 == 2 {
			advance(1500 * time.Millisecond) // retries and delayed sends come due, leases expire
		}
		switch round {
		case rounds / 3:
			n, err := b.Redrive(ctx, "orders", "workers", core.RedriveFilter{})
			must("Redrive", err)
			c.redriven += n
			_, err = b.Seek(ctx, "orders", "audit", "earliest", "c1", false)
			must("Seek audit c1", err)
			c.seeks++
		case rounds / 2:
			putMirror("from-hz", "red")
			putTopic("orders", core.TopicConfig{Queues: 6, RetentionHours: 1})
			putSub("orders", "workers", core.SubscriptionConfig{MaxRetries: &two, RetryDelays: []time.Duration{time.Second}, Filter: "red || green"})
			_, err := b.Seek(ctx, "orders", "workers", clk.Now().Add(-2*time.Second).Format(time.RFC3339Nano), "", false)
			must("Seek workers", err)
			c.seeks++
		case 2 * rounds / 3:
			before, err := b.GetTopic("orders")
			must("GetTopic", err)
			advance(61 * time.Minute)
			must("EnforceRetention", b.EnforceRetention())
			after, err := b.GetTopic("orders")
			must("GetTopic", err)
			c.retained = int(before.Messages - after.Messages)
		}
	}
	n, err := b.Redrive(ctx, "orders", "workers", core.RedriveFilter{})
	must("Redrive", err)
	c.redriven += n
	advance(3 * time.Second)
	settle("orders", "workers", pull("orders", "workers", "", time.Second), false)
	must("DeleteSubscription", b.DeleteSubscription(ctx, "orders", "audit"))
	must("DeleteTopic", b.DeleteTopic(ctx, "events"))
	must("DeleteMirror", b.DeleteMirror(ctx, "from-sg"))
	_, err = b.Send(ctx, "orders", []*core.Message{{Body: []byte("last"), Tag: "red"}})
	must("Send last", err)
	waitChecksRecorded(t, b, clk)
	return c
}

// waitChecksRecorded waits until no transaction check is due or running:
// a check runs on a goroutine of its own and records its answer with a
// commit of its own, which must not land in a state a test takes as final.
// The clock stands still, so once every open transaction's next check is
// in the future, nothing starts another.
func waitChecksRecorded(t *testing.T, b *core.Broker, clk *testClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for wait := time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		open, err := b.ListTransactions("payments")
		if err != nil {
			t.Fatalf("ListTransactions: %v", err)
		}
		due := 0
		for _, tx := range open {
			if !tx.NextCheckAt.After(clk.Now()) {
				due++
			}
		}
		if due == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d transaction checks still due or running after 10 s", due)
		}
		time.Sleep(wait)
	}
}

// wantCoverage fails the test unless the workload did each kind of write.
func wantCoverage(t *testing.T, c workloadCounts) {
	t.Helper()
	if c.sent == 0 || c.deduped == 0 || c.delayedDue == 0 || c.acked == 0 || c.nacked == 0 || c.dead == 0 ||
		c.redriven == 0 || c.expired == 0 || c.seeks == 0 || c.retained == 0 || c.mirrored == 0 || c.mirrorSkipped == 0 ||
		c.committed == 0 || c.rolledBack == 0 || c.prepared == c.committed+c.rolledBack {
		t.Fatalf("the workload missed a kind of write: %+v", c)
	}
}

// A store created empty that applies a broker's committed batches, in
// commit order, holds the broker's store byte for byte after every commit:
// it fails if any commit writes something its batch does not carry (a
// write outside the batch, index entries Repr leaves out), or if applying
// differs from committing. Dropping one batch makes the follower differ,
// so the comparison sees a missing commit.
func TestFollowerAppliesBatchesByteIdentical(t *testing.T) {
	for _, drop := range []int{0, 5} {
		t.Run(fmt.Sprintf("drop=%d", drop), func(t *testing.T) {
			follower := openStore(t, vfs.NewMem(), "db")
			var leader *pebblestore.Store
			var mismatches []int
			// With drop, the first commit from the drop-th on that changed
			// the leader's data is not applied: a commit that changed
			// nothing (a timer loop's clean-up with nothing to clean)
			// could not be missed.
			dropped := 0
			var leaderBefore [32]byte
			obs := &observer{inner: core.LocalProposer(true)}
			obs.after = func(n int, repr []byte) {
				var leaderNow [32]byte
				if leader != nil {
					leaderNow = fingerprintOff(t, leader)
				}
				skip := drop > 0 && dropped == 0 && n >= drop && leader != nil && leaderNow != leaderBefore
				leaderBefore = leaderNow
				if skip {
					dropped = n
				} else if err := follower.ApplyBatch(repr, false); err != nil {
					t.Errorf("ApplyBatch of commit %d: %v", n, err)
					return
				}
				if leader == nil {
					return // the start's epoch, committed inside core.New
				}
				// Flushes at different points: the stores' files differ,
				// their contents must not.
				flushAt(t, leader, n, 150)
				flushAt(t, follower, n, 220)
				if leaderNow != fingerprintOff(t, follower) {
					mismatches = append(mismatches, n)
				}
			}
			clk := &testClock{now: time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)}
			b, store := openObservedBroker(t, vfs.NewMem(), clk, obs)
			obs.mu.Lock()
			leader = store // the comparison after the next commit covers the epoch's
			obs.mu.Unlock()
			rounds := 60
			if drop > 0 {
				rounds = 3
			}
			c := runWorkload(t, b, clk, 1, rounds)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			t.Logf("%d commits, workload %+v", obs.n, c)
			if drop > 0 {
				if dropped == 0 {
					t.Fatalf("no commit from the %dth on changed the leader's data", drop)
				}
				if len(mismatches) == 0 || mismatches[0] != dropped {
					t.Fatalf("commit %d was not applied, yet the follower first differed at %v", dropped, mismatches)
				}
				return
			}
			wantCoverage(t, c)
			if obs.n < 300 {
				t.Fatalf("only %d commits", obs.n)
			}
			if len(mismatches) > 0 {
				t.Fatalf("the follower differed after %d of %d commits, first at commit %d", len(mismatches), obs.n, mismatches[0])
			}
		})
	}
}

// crashPoint is a crash taken right after a commit: the filesystem as a
// power loss would leave it, and the store's fingerprint then.
type crashPoint struct {
	commit int
	fs     *vfs.MemFS
	want   [32]byte
}

// A store reopened after a crash (only synced data kept) holds exactly what
// the store held when the last commit returned: it fails if a synced
// commit is not durable as a whole, or if recovery keeps something the
// running store did not hold. With commits not synced the crash loses
// data, so the comparison sees a lost commit.
func TestCrashedStoreReplaysToLastCommit(t *testing.T) {
	for _, sync := range []bool{true, false} {
		t.Run(fmt.Sprintf("sync=%v", sync), func(t *testing.T) {
			fs := vfs.NewCrashableMem()
			rng := rand.New(rand.NewPCG(3, 4))
			var leader *pebblestore.Store
			var points []crashPoint
			const maxPoints = 40
			obs := &observer{inner: core.LocalProposer(sync)}
			obs.after = func(n int, _ []byte) {
				if leader == nil {
					return
				}
				flushAt(t, leader, n, 100) // recovery reads sstables, not only the WAL
				if len(points) == maxPoints || (n > 3 && rng.IntN(18) != 0) {
					return
				}
				points = append(points, crashPoint{commit: n, fs: fs.CrashClone(vfs.CrashCloneCfg{}), want: fingerprintOff(t, leader)})
			}
			clk := &testClock{now: time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)}
			b, store := openObservedBroker(t, fs, clk, obs)
			obs.mu.Lock()
			leader = store
			obs.mu.Unlock()
			rounds := 60
			if !sync {
				rounds = 6
			}
			c := runWorkload(t, b, clk, 2, rounds)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if sync {
				wantCoverage(t, c)
			}
			obs.mu.Lock()
			defer obs.mu.Unlock()
			if min := map[bool]int{true: 20, false: 5}[sync]; len(points) < min {
				t.Fatalf("only %d crash points in %d commits", len(points), obs.n)
			}
			var lost []int
			for _, p := range points {
				s := openStore(t, p.fs, "db")
				got := fingerprint(t, s)
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				if got != p.want {
					lost = append(lost, p.commit)
				}
			}
			t.Logf("%d commits, %d crash points; differing after commits %v", obs.n, len(points), lost)
			if sync && len(lost) > 0 {
				t.Fatalf("a crash right after commits %v left a store that differs from the one running then", lost)
			}
			if !sync && len(lost) == 0 {
				t.Fatalf("%d crashes after unsynced commits lost nothing: the comparison cannot see a lost commit", len(points))
			}
		})
	}
}

// A checkpoint holds every commit made before it, synced or not, and none
// made after; the directory must be new.
func TestCheckpointHoldsTheStoreAsOfTheCall(t *testing.T) {
	for _, c := range filesystems {
		t.Run(c.name, func(t *testing.T) {
			fs, dir := c.fs(t)
			s := openStore(t, fs, dir)
			writeFixture(t, s)
			b := s.NewBatch()
			b.PutAck(5, 1, 9)
			if err := b.Commit(false, false); err != nil {
				t.Fatal(err)
			}
			want := fingerprint(t, s)
			ckpt := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-checkpoint")
			if err := s.Checkpoint(ckpt); err != nil {
				t.Fatalf("Checkpoint: %v", err)
			}
			if err := s.Checkpoint(ckpt); err == nil {
				t.Error("a second Checkpoint into the same directory succeeded")
			}
			commit(t, s, func(b core.Batch) { b.DeleteAck(5, 1, 9) })
			copied := openStore(t, fs, ckpt)
			if got := fingerprint(t, copied); got != want {
				t.Fatal("the checkpoint's store differs from the store at the checkpoint")
			}
			if fingerprint(t, copied) == fingerprint(t, s) {
				t.Fatal("a commit after the checkpoint shows in it")
			}
			snap, err := copied.Load()
			if err != nil || len(snap.Topics) != 2 {
				t.Fatalf("the checkpoint loads %d topics, %v", len(snap.Topics), err)
			}
		})
	}
}

// ApplyBatch refuses bytes that are no batch, and an apply is durable as a
// synced commit is.
func TestApplyBatch(t *testing.T) {
	s := openStore(t, vfs.NewMem(), "db")
	for _, bad := range [][]byte{nil, {1, 2, 3}} {
		if err := s.ApplyBatch(bad, true); err == nil {
			t.Errorf("ApplyBatch(%x) succeeded", bad)
		}
	}
	fs := vfs.NewCrashableMem()
	leader, follower := openStore(t, vfs.NewMem(), "db"), openStore(t, fs, "db")
	b := leader.NewBatch()
	b.PutTopic(&core.TopicRecord{ID: 1, Name: "orders", Queues: 1})
	b.Append(&core.Message{ID: "m", TopicID: 1, Body: []byte("body"), Keys: []string{"k"}})
	repr := bytes.Clone(b.Repr())
	if err := b.Commit(true, false); err != nil {
		t.Fatal(err)
	}
	if err := follower.ApplyBatch(repr, true); err != nil {
		t.Fatal(err)
	}
	clear(repr) // the store keeps its own copy
	crashed := openStore(t, fs.CrashClone(vfs.CrashCloneCfg{}), "db")
	want := fingerprint(t, leader)
	if fingerprint(t, follower) != want || fingerprint(t, crashed) != want {
		t.Fatal("the applied batch differs from the committed one, or did not survive a crash")
	}
	if m, err := crashed.ReadMessage(0); err != nil || string(m.Body) != "body" {
		t.Fatalf("applied message: %v", err)
	}
	if err := follower.Close(); err != nil {
		t.Fatal(err)
	}
	if err := follower.ApplyBatch(repr, true); !errors.Is(err, core.ErrClosed) {
		t.Fatalf("ApplyBatch on a closed store: %v, want ErrClosed", err)
	}
}

// ApplyCommitted applies an entry's batch and records its index in one
// batch: a follower that applied a leader's batches holds the leader's data
// once the leader records the same index. The entry's bytes stay the
// caller's (they are the raft log's): a follower that pooled them would
// overwrite them with a later batch.
func TestApplyCommitted(t *testing.T) {
	leader, follower := openStore(t, vfs.NewMem(), "db"), openStore(t, vfs.NewMem(), "db")
	var entries, kept [][]byte
	for i := range 30 {
		b := leader.NewBatch()
		if i == 0 {
			b.PutTopic(&core.TopicRecord{ID: 1, Name: "orders", Queues: 1})
		}
		for j := range 50 {
			b.Append(&core.Message{ID: fmt.Sprintf("m%d-%d", i, j), TopicID: 1, Offset: uint64(i*50 + j), Seq: uint64(i*50 + j),
				Body: bytes.Repeat([]byte{byte(i)}, 1000+i)})
		}
		entry := bytes.Clone(b.Repr())
		if err := b.Commit(false, false); err != nil {
			t.Fatal(err)
		}
		entries, kept = append(entries, entry), append(kept, bytes.Clone(entry))
		if err := follower.ApplyCommitted(1, uint64(10+i), entry); err != nil {
			t.Fatalf("ApplyCommitted of entry %d: %v", 10+i, err)
		}
	}
	if err := leader.ApplyCommitted(1, 39, nil); err != nil {
		t.Fatal(err)
	}
	if fingerprint(t, follower) != fingerprint(t, leader) {
		t.Fatal("the follower's data differs from the leader's")
	}
	if n, err := follower.AppliedIndex(1); err != nil || n != 39 {
		t.Fatalf("AppliedIndex = %d, %v; want 39", n, err)
	}
	for i := range entries {
		if !bytes.Equal(entries[i], kept[i]) {
			t.Fatalf("entry %d's bytes changed after it was applied", 10+i)
		}
	}
}
