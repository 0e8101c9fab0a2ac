package main

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The nemesis test's checker: pure functions over what the clients saw,
// held to SPEC §1, §2 and §7.2. TestClusterNemesis records a nemHistory
// and calls checkNemesis and failoverTimes once every client has stopped.

// nemMsg is one message a producer made up. Its body and dedupKey are
// unique in the run; the messages of one sharding key all come from one
// producer, which sends them one request after the other.
type nemMsg struct {
	body, dedupKey string
	key            string // shardingKey; "" for none
	producer, seq  int
	delay          time.Duration // delaySeconds, 0 for none
	firstSent      time.Time     // the start of its first send request
}

// nemReply is what one 201 said about one message.
type nemReply struct {
	body      string
	id        string
	queue     int
	offset    uint64
	hasOffset bool // false for a delayed message not due yet (offset null)
	duplicate bool
	node      string
	start, at time.Time // the request's start, the reply's arrival
	resend    bool      // a deliberate re-send of an acknowledged message
}

// nemAttempt is one send request, single or batch.
type nemAttempt struct {
	node       string
	start, end time.Time
	status     int    // 0: no answer (refused, timed out, cut)
	code       string // the problem's code, for a 4xx or 5xx
	retryAfter string // the Retry-After header
	messages   int
}

// nemDelivery is one message of one pull's reply.
type nemDelivery struct {
	sub      string
	id, body string
	queue    int
	offset   uint64
	attempt  int
	at       time.Time
}

// nemFault is one thing the nemesis did to the nodes.
type nemFault struct {
	kind  string   // nemKillLeader, nemStopLeader, nemKillFollower, nemKillTwo
	nodes []string // the nodes it hit
	at    time.Time
	end   time.Time // restarted (or SIGCONT); for nemKillTwo the first restart
}

const (
	nemKillLeader   = "kill-leader"
	nemStopLeader   = "stop-leader"
	nemKillFollower = "kill-follower"
	nemKillTwo      = "kill-two"
)

// nemHistory is the whole record; deliveries in the order the consumers
// received them (each consumer records a pull before it acks it).
type nemHistory struct {
	msgs       map[string]nemMsg // by body
	replies    []nemReply
	attempts   []nemAttempt
	deliveries []nemDelivery
	faults     []nemFault
	subs       []string // the subscriptions, each of which gets every message
	orderly    string   // the orderly one among them
	queues     []nemQueue
}

// nemQueue is one entry of the topic's queueStats once drained: the
// retained offsets [min, max).
type nemQueue struct {
	queue    int
	min, max uint64
}

type nemStats struct {
	acked        int            // messages with a 201
	delivered    map[string]int // per subscription: distinct messages
	redeliveries map[string]int // per subscription: deliveries beyond the first
	resends      int            // deliberate re-sends of acknowledged messages
	status503    int
	noAnswer     int
	faults       int
}

func (s nemStats) String() string {
	var subs []string
	for _, sub := range slices.Sorted(maps.Keys(s.delivered)) {
		subs = append(subs, fmt.Sprintf("%s: %d delivered, %d redeliveries", sub, s.delivered[sub], s.redeliveries[sub]))
	}
	return fmt.Sprintf("%d acked; %s; %d resends; %d 503s, %d sends without answer; %d faults",
		s.acked, strings.Join(subs, "; "), s.resends, s.status503, s.noAnswer, s.faults)
}

// nemMaxWait is the longest a send may wait for its answer through a node
// that runs: the 5 s a request waits for a leader, and slack for a loaded
// machine.
const nemMaxWait = 6500 * time.Millisecond

// delayedSlack is how much earlier than its send's start plus its delay a
// delayed message may be delivered: the broker's and the test's clocks
// are the same, so only rounding to the millisecond.
const delayedSlack = 50 * time.Millisecond

// checkNemesis holds the record to the guarantees and returns what broke
// them, one entry per kind of problem.
func checkNemesis(h *nemHistory) (nemStats, []string) {
	st := nemStats{delivered: map[string]int{}, redeliveries: map[string]int{}, faults: len(h.faults)}
	var problems []string
	report := func(what string, bad []string) {
		if len(bad) > 0 {
			slices.Sort(bad)
			problems = append(problems, fmt.Sprintf("%s: %d times, e.g.\n  %s", what, len(bad), strings.Join(bad[:min(10, len(bad))], "\n  ")))
		}
	}
	for _, a := range h.attempts {
		switch a.status {
		case 0:
			st.noAnswer++
		case 503:
			st.status503++
		}
	}

	// The replies of each message, in the order they arrived.
	repliesOf := map[string][]nemReply{}
	for _, r := range h.replies {
		repliesOf[r.body] = append(repliesOf[r.body], r)
		if r.resend {
			st.resends++
		}
	}
	for _, rs := range repliesOf {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].at.Before(rs[j].at) })
	}
	st.acked = len(repliesOf)
	if st.acked == 0 {
		report("no send was acknowledged", []string{"none"})
	}

	// Each message id names one body at one position; each position one id;
	// each body one id (its dedupKey, or its one becoming due).
	type pos struct {
		queue  int
		offset uint64
	}
	idAt := map[pos]string{}
	type where struct {
		body     string
		pos      pos
		hasPos   bool
		fromWhat string
	}
	ofID := map[string]where{}
	idsOfBody := map[string][]string{}
	var unknown, inconsistent, twoAtOne []string
	note := func(id, body string, p pos, hasPos bool, from string) {
		if hasPos {
			if prev, ok := idAt[p]; ok && prev != id {
				twoAtOne = append(twoAtOne, fmt.Sprintf("queue %d offset %d: %s and %s (%s)", p.queue, p.offset, prev, id, from))
			} else {
				idAt[p] = id
			}
		}
		w, ok := ofID[id]
		if !ok {
			ofID[id] = where{body, p, hasPos, from}
			idsOfBody[body] = append(idsOfBody[body], id)
			return
		}
		if w.body != body || (w.hasPos && hasPos && w.pos != p) {
			inconsistent = append(inconsistent, fmt.Sprintf("%s is %q at %d/%d (%s) and %q at %d/%d (%s)", id, w.body, w.pos.queue, w.pos.offset, w.fromWhat, body, p.queue, p.offset, from))
		}
		if !w.hasPos && hasPos {
			ofID[id] = where{body, p, true, from}
		}
	}
	for _, r := range h.replies {
		note(r.id, r.body, pos{r.queue, r.offset}, r.hasOffset, "201 via "+r.node)
	}
	first := map[string]map[string]int{} // sub → id → index of its first delivery
	for _, s := range h.subs {
		first[s] = map[string]int{}
	}
	var early []string
	for i, d := range h.deliveries {
		m, known := h.msgs[d.body]
		if !known {
			unknown = append(unknown, fmt.Sprintf("%s delivered on %s with body %q, which no producer sent", d.id, d.sub, d.body))
		}
		note(d.id, d.body, pos{d.queue, d.offset}, true, "delivered on "+d.sub)
		if first[d.sub] == nil {
			first[d.sub] = map[string]int{}
		}
		if _, seen := first[d.sub][d.id]; seen {
			st.redeliveries[d.sub]++
			continue
		}
		first[d.sub][d.id] = i
		st.delivered[d.sub]++
		// Whichever request stored it started no earlier than the first.
		if due := m.firstSent.Add(m.delay); known && m.delay > 0 && d.at.Before(due.Add(-delayedSlack)) {
			early = append(early, fmt.Sprintf("%s (delay %v) delivered on %s %v before it was due", d.body, m.delay, d.sub, due.Sub(d.at).Round(time.Millisecond)))
		}
	}
	report("delivered a message no producer sent", unknown)
	report("one message id at two places or with two bodies", inconsistent)
	report("queue offset given to two messages", twoAtOne)
	report("delayed message delivered before it was due", early)

	// Gap-free: each subscription got every retained offset of every queue
	// and none beyond (SPEC §1: offsets 0, 1, 2, …), whatever leader stored it.
	var gaps []string
	for _, s := range h.subs {
		got := map[pos]bool{}
		for _, d := range h.deliveries {
			if d.sub == s {
				got[pos{d.queue, d.offset}] = true
			}
		}
		for _, q := range h.queues {
			if q.min != 0 {
				gaps = append(gaps, fmt.Sprintf("queue %d: minOffset %d, want 0 (nothing is past retention)", q.queue, q.min))
			}
			var missing []uint64
			for o := q.min; o < q.max; o++ {
				if !got[pos{q.queue, o}] {
					missing = append(missing, o)
				}
			}
			if len(missing) > 0 {
				gaps = append(gaps, fmt.Sprintf("%s: queue %d: offsets %v of [%d, %d) never delivered", s, q.queue, missing[:min(10, len(missing))], q.min, q.max))
			}
		}
		for p := range got {
			i := slices.IndexFunc(h.queues, func(q nemQueue) bool { return q.queue == p.queue })
			if h.queues != nil && (i < 0 || p.offset >= h.queues[i].max) {
				gaps = append(gaps, fmt.Sprintf("%s: delivered queue %d offset %d, beyond the topic's queueStats", s, p.queue, p.offset))
			}
		}
	}
	report("offsets not gap-free", gaps)

	// At least once: every 201 is delivered on every subscription, as the
	// message the 201 named.
	var lost []string
	for body, rs := range repliesOf {
		id := rs[0].id
		for _, s := range h.subs {
			if _, ok := first[s][id]; !ok {
				lost = append(lost, fmt.Sprintf("%s: %s (acknowledged via %s at %s) never delivered", s, body, rs[0].node, rs[0].at.Format("15:04:05.000")))
			}
		}
	}
	report("acknowledged message lost", lost)

	// Stored once: a retried dedupKey, a delayed message becoming due.
	var twice, delayedTwice []string
	for body, ids := range idsOfBody {
		if len(ids) < 2 {
			continue
		}
		line := fmt.Sprintf("%s stored as %v", body, ids)
		if h.msgs[body].delay > 0 {
			delayedTwice = append(delayedTwice, line)
		} else {
			twice = append(twice, line)
		}
	}
	report("message stored twice despite its dedupKey", twice)
	report("delayed message stored as two messages", delayedTwice)

	// A dedupKey sent again after its 201 gets the first reply back, marked
	// as a duplicate, whatever leader answers.
	var dedupOther, dedupUnmarked []string
	for body, rs := range repliesOf {
		f := rs[0]
		for _, r := range rs[1:] {
			after := h.faultBetween(f.at, r.start)
			switch {
			case r.id != f.id || (r.hasOffset && f.hasOffset && (r.queue != f.queue || r.offset != f.offset)):
				dedupOther = append(dedupOther, fmt.Sprintf("%s: first %s at %d/%d via %s, then %s at %d/%d via %s%s", body, f.id, f.queue, f.offset, f.node, r.id, r.queue, r.offset, r.node, after))
			case !r.duplicate:
				dedupUnmarked = append(dedupUnmarked, fmt.Sprintf("%s: %s answered again via %s without duplicate:true%s", body, r.id, r.node, after))
			}
		}
	}
	report("dedupKey sent again answered with another message", dedupOther)
	report("dedupKey sent again not answered duplicate:true", dedupUnmarked)

	// Orderly: per sharding key, first deliveries in send order, all from
	// one queue with growing offsets.
	if h.orderly != "" {
		type last struct {
			seq    int
			queue  int
			offset uint64
			body   string
		}
		byKey := map[string]last{}
		var order []string
		for i, d := range h.deliveries {
			if d.sub != h.orderly || first[d.sub][d.id] != i {
				continue // another subscription's, or a redelivery
			}
			m, ok := h.msgs[d.body]
			if !ok || m.key == "" {
				continue
			}
			prev, ok := byKey[m.key]
			switch {
			case !ok:
			case prev.queue != d.queue:
				order = append(order, fmt.Sprintf("%s in queues %d and %d", m.key, prev.queue, d.queue))
			case m.seq < prev.seq || d.offset < prev.offset:
				order = append(order, fmt.Sprintf("%s: %s (offset %d) first delivered after %s (offset %d), sent later", m.key, d.body, d.offset, prev.body, prev.offset))
			}
			byKey[m.key] = last{m.seq, d.queue, d.offset, d.body}
		}
		report("orderly subscription out of order", order)
	}

	// While two of three nodes are down nothing can be committed: no send
	// that starts then is acknowledged before a node is back, and each
	// answers 503 no_leader or not at all.
	var outage201, outageOther, outageEmpty []string
	for _, f := range h.faults {
		if f.kind != nemKillTwo {
			continue
		}
		tried := 0
		for _, a := range h.attempts {
			if a.start.Before(f.at) || !a.end.Before(f.end) {
				continue
			}
			tried++
			switch {
			case a.status >= 200 && a.status < 300:
				outage201 = append(outage201, fmt.Sprintf("%d via %s at %s, %v into the outage of %v", a.status, a.node, a.end.Format("15:04:05.000"), a.end.Sub(f.at).Round(time.Millisecond), f.nodes))
			case a.status == 0, a.status == 503 && a.code == "no_leader" && a.retryAfter != "":
			default:
				outageOther = append(outageOther, fmt.Sprintf("%d %q (Retry-After %q) via %s at %s", a.status, a.code, a.retryAfter, a.node, a.end.Format("15:04:05.000")))
			}
		}
		if tried == 0 { // else the checks above held over nothing
			outageEmpty = append(outageEmpty, fmt.Sprintf("%v down from %s to %s", f.nodes, f.at.Format("15:04:05.000"), f.end.Format("15:04:05.000")))
		}
	}
	report("majority outage with no send answered in it", outageEmpty)

	// A request waits at most 5 s for a leader (SPEC §7.2), so one through
	// a node no fault hit while it ran is answered well before the
	// client gives up.
	var slow []string
	for _, a := range h.attempts {
		if a.end.Sub(a.start) <= nemMaxWait {
			continue
		}
		hit := slices.ContainsFunc(h.faults, func(f nemFault) bool {
			return slices.Contains(f.nodes, a.node) && f.at.Before(a.end) && !f.end.Before(a.start)
		})
		if !hit {
			slow = append(slow, fmt.Sprintf("via %s from %s: %d %q after %v", a.node, a.start.Format("15:04:05.000"), a.status, a.code, a.end.Sub(a.start).Round(time.Millisecond)))
		}
	}
	report(fmt.Sprintf("send through a running node answered after more than %v", nemMaxWait), slow)
	report("send acknowledged while a majority was down", outage201)
	report("send during a majority outage answered other than 503 no_leader with Retry-After, or nothing", outageOther)
	return st, problems
}

// faultBetween names the faults that began between from and to, for a
// problem's line.
func (h *nemHistory) faultBetween(from, to time.Time) string {
	var fs []string
	for _, f := range h.faults {
		if !f.at.Before(from) && f.at.Before(to) {
			fs = append(fs, fmt.Sprintf("%s %v at %s", f.kind, f.nodes, f.at.Format("15:04:05.000")))
		}
	}
	if len(fs) == 0 {
		return ""
	}
	return " (after " + strings.Join(fs, ", ") + ")"
}

// failoverTimes is, for each fault of the kind (nemKillLeader: the
// failover), the time from it to the first 201 of a send that started
// after it through a live node (another one, or the one hit once it is
// back); a fault with no such 201 is a problem.
func failoverTimes(h *nemHistory, kind string) ([]time.Duration, []string) {
	var ds []time.Duration
	var problems []string
	for _, f := range h.faults {
		if f.kind != kind {
			continue
		}
		var best time.Time
		for _, a := range h.attempts {
			// A killed node is live again once restarted.
			dead := slices.Contains(f.nodes, a.node) && a.start.Before(f.end)
			if a.status != 201 || a.start.Before(f.at) || dead {
				continue
			}
			if best.IsZero() || a.end.Before(best) {
				best = a.end
			}
		}
		if best.IsZero() {
			problems = append(problems, fmt.Sprintf("no send acknowledged through a live node after %s %v at %s", f.kind, f.nodes, f.at.Format("15:04:05.000")))
			continue
		}
		ds = append(ds, best.Sub(f.at))
	}
	return ds, problems
}

// medianMax of ds (zero for none).
func medianMax(ds []time.Duration) (median, maxd time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)-1]
}

// TestNemesisCheckCatchesViolations keeps the checker honest: a clean
// record passes, and each broken one is reported for its reason.
func TestNemesisCheckCatchesViolations(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	clean := func() *nemHistory {
		h := &nemHistory{msgs: map[string]nemMsg{}, subs: []string{"plain", "ord"}, orderly: "ord"}
		for _, m := range []nemMsg{
			{body: "a0", key: "p0-k0", producer: 0, seq: 0, firstSent: at(0)},
			{body: "a1", key: "p0-k0", producer: 0, seq: 1, firstSent: at(100)},
			{body: "b0", producer: 1, seq: 0, firstSent: at(0)},
			{body: "d0", producer: 1, seq: 1, delay: time.Second, firstSent: at(200)},
		} {
			m.dedupKey = "dk-" + m.body
			h.msgs[m.body] = m
		}
		h.replies = []nemReply{
			{body: "a0", id: "A0", queue: 0, offset: 0, hasOffset: true, node: "n1", start: at(0), at: at(10)},
			{body: "b0", id: "B0", queue: 1, offset: 0, hasOffset: true, node: "n2", start: at(0), at: at(10)},
			{body: "a1", id: "A1", queue: 0, offset: 1, hasOffset: true, node: "n1", start: at(100), at: at(110)},
			{body: "d0", id: "D0", node: "n3", start: at(200), at: at(210)},
			// Sent again after the leader's kill: the first reply, marked.
			{body: "a0", id: "A0", queue: 0, offset: 0, hasOffset: true, duplicate: true, node: "n2", start: at(2500), at: at(2510), resend: true},
		}
		h.faults = []nemFault{
			{kind: nemKillLeader, nodes: []string{"n1"}, at: at(1000), end: at(3000)},
			{kind: nemKillTwo, nodes: []string{"n1", "n2"}, at: at(10000), end: at(16000)},
		}
		h.attempts = []nemAttempt{
			{node: "n1", start: at(0), end: at(10), status: 201, messages: 1},
			{node: "n1", start: at(900), end: at(1000), status: 0, messages: 1},
			{node: "n2", start: at(1200), end: at(1900), status: 201, messages: 1},
			{node: "n3", start: at(11000), end: at(15000), status: 503, code: "no_leader", retryAfter: "1", messages: 1},
			{node: "n1", start: at(11000), end: at(11001), status: 0, messages: 1},
			// Through a node while it was down: slow is allowed.
			{node: "n2", start: at(9000), end: at(17000), status: 0, messages: 1},
		}
		for _, sub := range h.subs {
			h.deliveries = append(h.deliveries,
				nemDelivery{sub: sub, id: "A0", body: "a0", queue: 0, offset: 0, attempt: 1, at: at(20)},
				nemDelivery{sub: sub, id: "B0", body: "b0", queue: 1, offset: 0, attempt: 1, at: at(20)},
				nemDelivery{sub: sub, id: "A1", body: "a1", queue: 0, offset: 1, attempt: 1, at: at(120)},
				nemDelivery{sub: sub, id: "D0", body: "d0", queue: 1, offset: 1, attempt: 1, at: at(1300)},
			)
		}
		h.queues = []nemQueue{{0, 0, 2}, {1, 0, 2}}
		// Redelivered after the kill: allowed, counted.
		h.deliveries = append(h.deliveries, nemDelivery{sub: "ord", id: "A1", body: "a1", queue: 0, offset: 1, attempt: 2, at: at(3000)})
		return h
	}
	st, problems := checkNemesis(clean())
	if len(problems) > 0 {
		t.Fatalf("clean record reported: %q", problems)
	}
	if st.acked != 4 || st.delivered["plain"] != 4 || st.delivered["ord"] != 4 || st.redeliveries["ord"] != 1 ||
		st.resends != 1 || st.status503 != 1 || st.noAnswer != 3 || st.faults != 2 {
		t.Errorf("clean record: %v", st)
	}
	ds, problems := failoverTimes(clean(), nemKillLeader)
	if len(problems) > 0 || !slices.Equal(ds, []time.Duration{900 * time.Millisecond}) {
		t.Errorf("failover of the clean record: %v, %q; want [900ms]", ds, problems)
	}

	dropDelivery := func(h *nemHistory, sub, id string) {
		h.deliveries = slices.DeleteFunc(h.deliveries, func(d nemDelivery) bool { return d.sub == sub && d.id == id })
	}
	for _, tc := range []struct {
		name  string
		spoil func(h *nemHistory)
		want  string
	}{
		{"lost ack", func(h *nemHistory) { dropDelivery(h, "plain", "A1") }, "acknowledged message lost"},
		{"lost ack on the orderly subscription only", func(h *nemHistory) { dropDelivery(h, "ord", "B0") }, "ord: b0"},
		{"offset given to two messages by two leaders", func(h *nemHistory) {
			h.msgs["c0"] = nemMsg{body: "c0", producer: 2, firstSent: at(2000)}
			h.replies = append(h.replies, nemReply{body: "c0", id: "C0", queue: 0, offset: 1, hasOffset: true, node: "n2", start: at(2000), at: at(2100)})
			for _, sub := range h.subs {
				h.deliveries = append(h.deliveries, nemDelivery{sub: sub, id: "C0", body: "c0", queue: 0, offset: 1, attempt: 1, at: at(2200)})
			}
		}, "queue offset given to two messages"},
		{"offset given to two messages, seen in deliveries", func(h *nemHistory) {
			h.msgs["c0"] = nemMsg{body: "c0", producer: 2, firstSent: at(2000)}
			h.deliveries = append(h.deliveries, nemDelivery{sub: "plain", id: "C0", body: "c0", queue: 1, offset: 0, attempt: 1, at: at(2200)})
		}, "queue 1 offset 0: B0 and C0"},
		{"per-key order broken", func(h *nemHistory) {
			h.deliveries[4], h.deliveries[6] = h.deliveries[6], h.deliveries[4] // ord: a1 before a0
		}, "orderly subscription out of order"},
		{"delayed message delivered as two stored messages", func(h *nemHistory) {
			h.deliveries = append(h.deliveries, nemDelivery{sub: "plain", id: "D0bis", body: "d0", queue: 1, offset: 2, attempt: 1, at: at(4000)})
		}, "delayed message stored as two messages"},
		{"delayed message delivered early", func(h *nemHistory) { h.deliveries[3].at = at(700) }, "delivered before it was due"},
		{"dedup broken after failover: a new message", func(h *nemHistory) {
			h.replies[4].id, h.replies[4].offset, h.replies[4].duplicate = "A0x", 2, false
		}, "answered with another message"},
		{"dedup broken after failover: stored twice", func(h *nemHistory) {
			h.deliveries = append(h.deliveries, nemDelivery{sub: "plain", id: "A0x", body: "a0", queue: 0, offset: 2, attempt: 1, at: at(4000)})
		}, "stored twice despite its dedupKey"},
		{"dedup reply not marked", func(h *nemHistory) { h.replies[4].duplicate = false }, "not answered duplicate:true"},
		{"201 during the majority outage", func(h *nemHistory) {
			h.attempts = append(h.attempts, nemAttempt{node: "n3", start: at(11000), end: at(12000), status: 201, messages: 1})
		}, "acknowledged while a majority was down"},
		{"500 during the majority outage", func(h *nemHistory) { h.attempts[3].status = 500 }, "other than 503 no_leader"},
		{"no_leader without Retry-After", func(h *nemHistory) { h.attempts[3].retryAfter = "" }, "other than 503 no_leader"},
		{"no send during the majority outage", func(h *nemHistory) { h.attempts = h.attempts[:3] }, "majority outage with no send"},
		{"a send hung on a running node", func(h *nemHistory) {
			h.attempts = append(h.attempts, nemAttempt{node: "n3", start: at(20000), end: at(28000), status: 0, messages: 1})
		}, "answered after more than 6.5s"},
		{"unknown body", func(h *nemHistory) { h.deliveries[1].body = "garbage" }, "no producer sent"},
		{"gap", func(h *nemHistory) { h.queues[1].max = 3 }, "ord: queue 1: offsets [2] of [0, 3) never delivered"},
		{"beyond maxOffset", func(h *nemHistory) { h.queues[0].max = 1 }, "beyond the topic's queueStats"},
		{"retention cut", func(h *nemHistory) { h.queues[0].min = 1 }, "minOffset 1"},
		{"one id, two bodies", func(h *nemHistory) { h.deliveries[5].body = "a0" }, "one message id at two places"},
	} {
		h := clean()
		tc.spoil(h)
		_, problems := checkNemesis(h)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: not reported (want %q); got %q", tc.name, tc.want, problems)
		}
	}

	h := clean()
	h.attempts = slices.DeleteFunc(h.attempts, func(a nemAttempt) bool { return a.node == "n2" })
	h.attempts = append(h.attempts, nemAttempt{node: "n1", start: at(1100), end: at(1500), status: 201}) // the dead node's
	if _, problems := failoverTimes(h, nemKillLeader); len(problems) != 1 || !strings.Contains(problems[0], "no send acknowledged") {
		t.Errorf("kill with no 201 after it through a live node: %q", problems)
	}
	if m, x := medianMax([]time.Duration{3, 1, 2, 5}); m != 3 || x != 5 {
		t.Errorf("medianMax: %v %v", m, x)
	}
}
