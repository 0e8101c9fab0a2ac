package core_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// TestOrderlyRandomWorkload drives an orderly subscription with random
// sends, pulls, acks (in any order), nacks, dead-letters, extends, clock
// steps and restarts on real Pebble, and checks what a consumer sees
// against a model of SPEC §2:
//   - a pull's messages of a key are the key's first messages not yet
//     done (acked or dead), in order;
//   - no pull gets a message of a key while another pull holds a live
//     lease of that key (live: not settled, not revoked, not run out, and
//     no earlier message of its pull's run of the key ran out first);
//   - a handle a failure of an earlier message of its pull revoked, or
//     whose message was handed out again, settles and extends nothing;
//   - in the end every message is done.
func TestOrderlyRandomWorkload(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 6}
	if core.RaceEnabled || testing.Short() {
		seeds = seeds[:2]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			newOrderlyModel(t, seed).run(1500)
		})
	}
}

type omsg struct {
	id, key string
	done    bool
	why     string
	latest  *ohandle // the last delivery of it
}

type ohandle struct {
	h          string
	m          *omsg
	run        []*ohandle // the pull's messages of the key, in order
	deadlineMs int64
	settled    bool // acked, nacked or dead-lettered by this handle
	revoked    bool // an earlier message of its run failed
	old        bool // from before a restart: not checked
}

type orderlyModel struct {
	t     *testing.T
	seed  uint64
	rng   *rand.Rand
	clk   *clock
	e     *env
	keys  map[string][]*omsg // in offset order
	byID  map[string]*omsg
	held  []*ohandle
	step  int
	stats map[string]int
}

const (
	omTopic = "orders"
	omGroup = "g"
)

func newOrderlyModel(t *testing.T, seed uint64) *orderlyModel {
	clk := newClock()
	m := &orderlyModel{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed*7+1)), clk: clk,
		keys: map[string][]*omsg{}, byID: map[string]*omsg{}, stats: map[string]int{}}
	m.e = newEnv(t, core.Options{Now: clk.Now})
	m.e.putTopic(omTopic, 2)
	m.e.subscribe(omTopic, omGroup, core.SubscriptionConfig{Orderly: true, MaxRetries: intPtr(core.MaxMaxRetries),
		RetryDelays: []time.Duration{time.Second, 2 * time.Second}})
	return m
}

func (m *orderlyModel) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("seed %d step %d: %s", m.seed, m.step, fmt.Sprintf(format, args...))
}

func (m *orderlyModel) nowMs() int64 { return m.clk.Now().UnixMilli() }

// live says h's lease still holds its key, as far as the model knows.
func (m *orderlyModel) live(h *ohandle) bool {
	now := m.nowMs()
	if h.settled || h.revoked || h.old || h.deadlineMs <= now || h.m.latest != h {
		return false
	}
	for _, g := range h.run {
		if g == h {
			return true
		}
		if !g.settled && !g.revoked && g.deadlineMs <= now {
			return false // it ran out first: that revoked h
		}
	}
	return true
}

func (m *orderlyModel) run(steps int) {
	for m.step = 1; m.step <= steps && !m.t.Failed(); m.step++ {
		switch n := m.rng.IntN(100); {
		case n < 22:
			m.send()
		case n < 47:
			m.pull(1+m.rng.IntN(8), time.Duration(1+m.rng.IntN(3))*time.Second)
		case n < 67:
			m.settle("ack")
		case n < 75:
			m.settle("nack")
		case n < 78:
			m.settle("deadletter")
		case n < 84:
			m.settle("extend")
		case n < 98:
			m.clk.Advance(time.Duration(100+m.rng.IntN(2500)) * time.Millisecond)
		default:
			m.restart()
		}
	}
	// Drain: every message comes and is acked, in bounded rounds.
	for range 200 {
		if m.allDone() {
			break
		}
		m.clk.Advance(3 * time.Second)
		got := m.pull(core.MaxMaxMessages, 30*time.Second)
		if len(got) > 0 {
			m.ackHandles(got)
		}
	}
	if !m.allDone() {
		m.fail("messages left undone after the drain: %v", m.undone())
	}
	m.t.Logf("seed %d: %v", m.seed, m.stats)
}

func (m *orderlyModel) send() {
	keys := []string{"a", "b", "c", ""}
	msgs := make([]*core.Message, 1+m.rng.IntN(4))
	for i := range msgs {
		msgs[i] = &core.Message{Body: fmt.Appendf(nil, "s%d.%d", m.step, i), ShardingKey: keys[m.rng.IntN(len(keys))]}
	}
	res := m.e.sendBatch(omTopic, msgs...)
	for i, r := range res {
		key := "k:" + msgs[i].ShardingKey
		if msgs[i].ShardingKey == "" {
			key = fmt.Sprintf("q:%d", r.QueueID) // ordered by queue
		}
		om := &omsg{id: r.MessageID, key: key}
		m.keys[key] = append(m.keys[key], om)
		m.byID[om.id] = om
	}
	m.stats["sent"] += len(res)
}

func (m *orderlyModel) pull(max int, invisible time.Duration) []*ohandle {
	for _, d := range m.e.listDead(omTopic, omGroup) {
		if om := m.byID[d.Message.ID]; om != nil {
			om.done = true
		}
	}
	now := m.clk.Now()
	got := m.e.pull(omTopic, omGroup, core.PullRequest{MaxMessages: max, Invisible: invisible, ConsumerID: fmt.Sprintf("c%d", m.rng.IntN(2))})
	deadline := (now.Add(invisible).UnixNano() + 999_999) / 1e6
	runs := map[string][]*ohandle{}
	var out []*ohandle
	for _, d := range got {
		om := m.byID[d.Message.ID]
		if om == nil {
			m.fail("pulled unknown message %s", d.Message.ID)
		}
		if om.done {
			m.fail("pulled %s of key %s, which is done (%s)", d.Message.Body, om.key, om.why)
		}
		h := &ohandle{h: d.ReceiptHandle, m: om, deadlineMs: deadline}
		runs[om.key] = append(runs[om.key], h)
		out = append(out, h)
	}
	for key, run := range runs {
		for _, other := range m.held {
			if other.m.key == key && m.live(other) {
				m.fail("pull got %d messages of key %s while %s is leased by an earlier pull", len(run), key, other.m.id)
			}
		}
		var want []*omsg
		for _, om := range m.keys[key] {
			if !om.done && len(want) < len(run) {
				want = append(want, om)
			}
		}
		for i, h := range run {
			if h.m != want[i] {
				m.fail("key %s: pull's message %d is %s, want %s (the key's first not done, in order)", key, i, h.m.id, want[i].id)
			}
			h.run = run
			h.m.latest = h
		}
		if len(run) > 1 {
			m.stats["runs of several"]++
		}
	}
	m.held = append(m.held, out...)
	m.stats["delivered"] += len(out)
	return out
}

// pick takes 1-3 held handles, in random order.
func (m *orderlyModel) pick() []*ohandle {
	if len(m.held) == 0 {
		return nil
	}
	n := min(1+m.rng.IntN(3), len(m.held))
	m.rng.Shuffle(len(m.held), func(i, j int) { m.held[i], m.held[j] = m.held[j], m.held[i] })
	out := slices.Clone(m.held[:n])
	if m.rng.IntN(4) != 0 { // sometimes a handle is used again
		m.held = m.held[n:]
	}
	return out
}

// spent says a handle must settle and extend nothing.
func (m *orderlyModel) spent(h *ohandle) bool {
	return !h.old && (h.revoked || h.m.latest != h || h.settled)
}

func (m *orderlyModel) settle(op string) {
	hs := m.pick()
	if len(hs) == 0 {
		return
	}
	strs := make([]string, len(hs))
	wasDone := make([]bool, len(hs))
	for i, h := range hs {
		strs[i], wasDone[i] = h.h, h.m.done
	}
	ctx := m.t.Context()
	var n int
	var failed []core.HandleResult
	var err error
	inv := time.Duration(1+m.rng.IntN(3)) * time.Second
	switch op {
	case "ack":
		n, failed, err = m.e.b.Ack(ctx, omTopic, omGroup, strs)
	case "nack":
		delay := time.Duration(-1)
		if m.rng.IntN(2) == 0 {
			delay = time.Duration(m.rng.IntN(2000)) * time.Millisecond
		}
		n, failed, err = m.e.b.Nack(ctx, omTopic, omGroup, strs, delay, "random")
	case "deadletter":
		n, failed, err = m.e.b.DeadLetter(ctx, omTopic, omGroup, strs, "random")
	case "extend":
		n, failed, err = m.e.b.Extend(ctx, omTopic, omGroup, strs, inv)
	}
	if err != nil {
		m.fail("%s: %v", op, err)
	}
	refused := map[string]bool{}
	for _, f := range failed {
		refused[f.ReceiptHandle] = true
	}
	if n != len(hs)-len(failed) {
		m.fail("%s of %d handles: n=%d with %d failed", op, len(hs), n, len(failed))
	}
	for i, h := range hs {
		if refused[h.h] {
			m.stats[op+" refused"]++
			continue
		}
		m.stats[op]++
		if h.old {
			if op == "ack" {
				h.m.done = true // an ack of a lease from before the restart counts
				h.m.why = fmt.Sprintf("old ack step %d", m.step)
			}
			continue
		}
		// An ack of a message done already answers success; nothing else
		// may succeed on a spent handle.
		if m.spent(h) && !(op == "ack" && wasDone[i]) {
			m.fail("%s of %s's handle succeeded, but it is spent (revoked=%t, handed out again=%t, settled=%t)",
				op, h.m.id, h.revoked, h.m.latest != h, h.settled)
		}
		switch op {
		case "ack", "deadletter":
			h.settled, h.m.done = true, true
			h.m.why = fmt.Sprintf("%s step %d wasDone %t spent %t", op, m.step, wasDone[i], m.spent(h))
		case "nack":
			h.settled = true
		case "extend":
			h.deadlineMs = (m.clk.Now().Add(inv).UnixNano() + 999_999) / 1e6
		}
		if op == "nack" || op == "deadletter" {
			// A failure revokes the run's messages after it.
			after := false
			for _, g := range h.run {
				if after && !g.settled {
					g.revoked = true
				}
				after = after || g == h
			}
		}
	}
}

func (m *orderlyModel) ackHandles(hs []*ohandle) {
	strs := make([]string, len(hs))
	for i, h := range hs {
		strs[i] = h.h
	}
	n, failed, err := m.e.b.Ack(m.t.Context(), omTopic, omGroup, strs)
	if err != nil || n != len(hs) || len(failed) != 0 {
		m.fail("drain ack of %d: n=%d failed=%v err=%v", len(hs), n, failed, err)
	}
	for _, h := range hs {
		h.settled, h.m.done = true, true
	}
}

func (m *orderlyModel) restart() {
	m.e.restart()
	for _, h := range m.held {
		h.old = true
	}
	for _, om := range m.byID {
		if om.latest != nil {
			om.latest.old = true
		}
	}
	m.stats["restart"]++
}

func (m *orderlyModel) allDone() bool { return len(m.undone()) == 0 }

func (m *orderlyModel) undone() []string {
	var out []string
	for _, om := range m.byID {
		if !om.done {
			out = append(out, om.id)
		}
	}
	slices.Sort(out)
	return out
}
