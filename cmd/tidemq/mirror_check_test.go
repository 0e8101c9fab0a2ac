package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

// The mirror tests' checker: pure functions over what the clients saw and
// what each region's topic holds, held to SPEC §8. The process tests in
// mirror_test.go record a mirHistory and call checkMirror once every
// client has stopped and both topics were read back in storage order.

// mirMsg is one message a producer made up. Its body is unique in the
// run; the messages of one sharding key all come from one producer in one
// region, which sends them one request after the other (seq grows).
type mirMsg struct {
	body, key string
	region    string // where it was sent
	producer  int
	seq       int
}

// mirStored is one message as a region's topic holds it (read back with
// the query API, queue by queue, in offset order).
type mirStored struct {
	id, body, key    string
	queue            int
	offset           uint64
	bornAt, storedAt time.Time
	// The mirror properties; sourceID is "" on a message sent to this
	// region by a producer.
	sourceID, sourceRegion, path string
}

// mirDelivery is one message of one pull's reply on a region's
// subscription.
type mirDelivery struct {
	region, sub string
	id, body    string
	queue       int
	offset      uint64
}

// mirRoute is one mirror: into region to, from region from's topic.
type mirRoute struct{ from, to string }

// mirHistory is the whole record of a run.
type mirHistory struct {
	msgs       map[string]mirMsg      // by body
	acked      map[string]string      // body → messageId of its first 201
	stored     map[string][]mirStored // region → its topic, queue by queue in offset order
	deliveries []mirDelivery          // in the order the consumers received them
	subs       []mirSub               // orderly subscriptions whose deliveries are recorded
	routes     []mirRoute
}

// mirSub is one recorded subscription: it must get every message stored in
// its region, per key in order.
type mirSub struct{ region, name string }

type mirStats struct {
	acked    int
	stored   map[string]int // per region: originals + copies
	copies   map[string]int // per region
	redelivs int
}

func (s mirStats) String() string {
	var rs []string
	for _, r := range slices.Sorted(maps.Keys(s.stored)) {
		rs = append(rs, fmt.Sprintf("%s holds %d (%d copies)", r, s.stored[r], s.copies[r]))
	}
	return fmt.Sprintf("%d acked; %s; %d redeliveries", s.acked, strings.Join(rs, ", "), s.redelivs)
}

// checkMirror holds the record to SPEC §8 and returns what broke it, one
// entry per kind of problem: every message acknowledged in a region is
// stored there; every message stored in a mirror's source region is
// stored exactly once in the mirror's region, as a copy naming it, with
// its fields; no region holds a body twice (no ping-pong) or a body no
// route brings to it; per sharding key each region's storage order is the
// producer's; each recorded subscription got every message of its region,
// per key first deliveries in that order.
func checkMirror(h *mirHistory) (mirStats, []string) {
	st := mirStats{acked: len(h.acked), stored: map[string]int{}, copies: map[string]int{}}
	var problems []string
	report := func(what string, bad []string) {
		if len(bad) > 0 {
			slices.Sort(bad)
			problems = append(problems, fmt.Sprintf("%s: %d times, e.g.\n  %s", what, len(bad), strings.Join(bad[:min(10, len(bad))], "\n  ")))
		}
	}
	if len(h.acked) == 0 {
		report("no send was acknowledged", []string{"none"})
	}
	regions := slices.Sorted(maps.Keys(h.stored))
	// count[region][body] and the originals of each region by id.
	count := map[string]map[string]int{}
	originals := map[string]map[string]mirStored{}
	var unknown []string
	for _, r := range regions {
		count[r], originals[r] = map[string]int{}, map[string]mirStored{}
		for _, m := range h.stored[r] {
			st.stored[r]++
			count[r][m.body]++
			if _, ok := h.msgs[m.body]; !ok {
				unknown = append(unknown, fmt.Sprintf("%s: %s at %d/%d has body %q, which no producer sent", r, m.id, m.queue, m.offset, m.body))
			}
			if m.sourceID == "" {
				originals[r][m.id] = m
			} else {
				st.copies[r]++
			}
		}
	}
	report("stored a message no producer sent", unknown)

	// At the source: every 201 is stored, as the message it named.
	var lostAtSource []string
	for body, id := range h.acked {
		m := h.msgs[body]
		if o, ok := originals[m.region][id]; !ok || o.body != body {
			lostAtSource = append(lostAtSource, fmt.Sprintf("%s: %s (acknowledged as %s) not stored", m.region, body, id))
		}
	}
	report("acknowledged message not stored in its own region", lostAtSource)

	// Each mirror: every original of the source region once in the
	// destination, as a faithful copy.
	var missing, twice, orphan, unfaithful []string
	for _, rt := range h.routes {
		copiesOf := map[string][]mirStored{}
		for _, m := range h.stored[rt.to] {
			if m.sourceID != "" && m.sourceRegion == rt.from {
				copiesOf[m.sourceID] = append(copiesOf[m.sourceID], m)
			}
		}
		for id, o := range originals[rt.from] {
			cs := copiesOf[id]
			switch {
			case len(cs) == 0:
				missing = append(missing, fmt.Sprintf("%s → %s: %s (%s, stored %s) not copied", rt.from, rt.to, o.body, id, o.storedAt.Format("15:04:05.000")))
				continue
			case len(cs) > 1:
				var at []string
				for _, c := range cs {
					at = append(at, fmt.Sprintf("%s at %d/%d", c.id, c.queue, c.offset))
				}
				twice = append(twice, fmt.Sprintf("%s → %s: %s (%s) stored %d times: %s", rt.from, rt.to, o.body, id, len(cs), strings.Join(at, ", ")))
			}
			c := cs[0]
			var bad []string
			if c.body != o.body {
				bad = append(bad, fmt.Sprintf("body %q", c.body))
			}
			if c.key != o.key {
				bad = append(bad, fmt.Sprintf("shardingKey %q, source %q", c.key, o.key))
			}
			if want := joinPath(o.path, rt.from); c.path != want {
				bad = append(bad, fmt.Sprintf("mirror.path %q, want %q", c.path, want))
			}
			if !c.bornAt.Equal(o.bornAt) {
				bad = append(bad, fmt.Sprintf("bornAt %s, source %s", c.bornAt.Format(time.RFC3339Nano), o.bornAt.Format(time.RFC3339Nano)))
			}
			if len(bad) > 0 {
				unfaithful = append(unfaithful, fmt.Sprintf("%s → %s: copy %s of %s: %s", rt.from, rt.to, c.id, id, strings.Join(bad, ", ")))
			}
		}
		for id, cs := range copiesOf {
			if _, ok := originals[rt.from][id]; !ok {
				orphan = append(orphan, fmt.Sprintf("%s → %s: %s (%s) names source %s, which %s does not hold", rt.from, rt.to, cs[0].id, cs[0].body, id, rt.from))
			}
		}
	}
	report("message stored at the source not copied", missing)
	report("source message stored more than once at the destination", twice)
	report("copy of a message the source does not hold", orphan)
	report("copy differs from its source", unfaithful)

	// Per region, per body: one copy where a route brings it (or it was
	// sent), none elsewhere; so a copy never comes back (no ping-pong).
	var dup, stray []string
	for _, r := range regions {
		for body, n := range count[r] {
			m, ok := h.msgs[body]
			if !ok {
				continue // reported above
			}
			if n > 1 {
				dup = append(dup, fmt.Sprintf("%s holds %s (sent in %s) %d times", r, body, m.region, n))
			}
			if r != m.region && !slices.Contains(h.routes, mirRoute{m.region, r}) {
				stray = append(stray, fmt.Sprintf("%s holds %s (sent in %s), and no mirror brings %s's messages there", r, body, m.region, m.region))
			}
		}
	}
	report("region holds one message more than once", dup)
	report("region holds a message no mirror brings to it", stray)

	// Per key, each region's storage order is the producer's: one queue,
	// growing seq.
	var order []string
	for _, r := range regions {
		type last struct {
			seq   int
			queue int
			body  string
		}
		byKey := map[string]last{}
		for _, m := range h.stored[r] { // queue by queue, offset order
			mm, ok := h.msgs[m.body]
			if !ok || mm.key == "" {
				continue
			}
			prev, seen := byKey[mm.key]
			switch {
			case !seen:
			case prev.queue != m.queue:
				order = append(order, fmt.Sprintf("%s: key %s in queues %d and %d", r, mm.key, prev.queue, m.queue))
			case mm.seq <= prev.seq:
				order = append(order, fmt.Sprintf("%s: key %s: %s stored after %s, sent before it", r, mm.key, m.body, prev.body))
			}
			byKey[mm.key] = last{mm.seq, m.queue, m.body}
		}
	}
	report("per-key order not kept in storage", order)

	// The consumers: every stored message delivered, per key in order.
	var undelivered, delivOrder []string
	for _, s := range h.subs {
		first := map[string]bool{}
		lastSeq := map[string]mirStored{}
		for _, d := range h.deliveries {
			if d.region != s.region || d.sub != s.name {
				continue
			}
			if first[d.id] {
				st.redelivs++
				continue
			}
			first[d.id] = true
			mm, ok := h.msgs[d.body]
			if !ok || mm.key == "" {
				continue
			}
			if prev, seen := lastSeq[mm.key]; seen && h.msgs[prev.body].seq >= mm.seq {
				delivOrder = append(delivOrder, fmt.Sprintf("%s/%s: key %s: %s first delivered after %s, sent before it", s.region, s.name, mm.key, d.body, prev.body))
			}
			lastSeq[mm.key] = mirStored{body: d.body}
		}
		for _, m := range h.stored[s.region] {
			if !first[m.id] {
				undelivered = append(undelivered, fmt.Sprintf("%s/%s: %s (%s at %d/%d) never delivered", s.region, s.name, m.body, m.id, m.queue, m.offset))
			}
		}
	}
	report("stored message never delivered", undelivered)
	report("orderly subscription out of order", delivOrder)
	return st, problems
}

// joinPath is the mirror.path of a copy of a message whose own path is
// path, stored before in region.
func joinPath(path, region string) string {
	if path == "" {
		return region
	}
	return path + "," + region
}

// TestMirrorCheckCatchesViolations keeps the checker honest: a clean
// record passes, and each broken one is reported for its reason.
func TestMirrorCheckCatchesViolations(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	clean := func() *mirHistory {
		h := &mirHistory{msgs: map[string]mirMsg{}, acked: map[string]string{}, stored: map[string][]mirStored{},
			subs: []mirSub{{"sg", "ord"}}, routes: []mirRoute{{"hz", "sg"}, {"sg", "hz"}}}
		for _, m := range []mirMsg{
			{body: "hz-p0-s0", key: "hz-p0-k0", region: "hz", seq: 0},
			{body: "hz-p0-s1", key: "hz-p0-k0", region: "hz", seq: 1},
			{body: "hz-p0-s2", key: "hz-p0-k0", region: "hz", seq: 2}, // send failed, stored all the same
			{body: "hz-p0-s3", key: "hz-p0-k0", region: "hz", seq: 3}, // send failed, not stored
			{body: "sg-p0-s0", key: "sg-p0-k0", region: "sg", seq: 0},
		} {
			h.msgs[m.body] = m
		}
		h.acked = map[string]string{"hz-p0-s0": "H0", "hz-p0-s1": "H1", "sg-p0-s0": "S0"}
		h.stored["hz"] = []mirStored{
			{id: "H0", body: "hz-p0-s0", key: "hz-p0-k0", queue: 1, offset: 0, bornAt: at(0), storedAt: at(1)},
			{id: "H1", body: "hz-p0-s1", key: "hz-p0-k0", queue: 1, offset: 1, bornAt: at(10), storedAt: at(11)},
			{id: "H2", body: "hz-p0-s2", key: "hz-p0-k0", queue: 1, offset: 2, bornAt: at(20), storedAt: at(21)},
			{id: "HS0", body: "sg-p0-s0", key: "sg-p0-k0", queue: 3, offset: 0, bornAt: at(5), storedAt: at(40), sourceID: "S0", sourceRegion: "sg", path: "sg"},
		}
		h.stored["sg"] = []mirStored{
			{id: "SH0", body: "hz-p0-s0", key: "hz-p0-k0", queue: 1, offset: 0, bornAt: at(0), storedAt: at(30), sourceID: "H0", sourceRegion: "hz", path: "hz"},
			{id: "SH1", body: "hz-p0-s1", key: "hz-p0-k0", queue: 1, offset: 1, bornAt: at(10), storedAt: at(31), sourceID: "H1", sourceRegion: "hz", path: "hz"},
			{id: "SH2", body: "hz-p0-s2", key: "hz-p0-k0", queue: 1, offset: 2, bornAt: at(20), storedAt: at(32), sourceID: "H2", sourceRegion: "hz", path: "hz"},
			{id: "S0", body: "sg-p0-s0", key: "sg-p0-k0", queue: 3, offset: 0, bornAt: at(5), storedAt: at(6)},
		}
		for _, m := range h.stored["sg"] {
			h.deliveries = append(h.deliveries, mirDelivery{region: "sg", sub: "ord", id: m.id, body: m.body, queue: m.queue, offset: m.offset})
		}
		// A redelivery after a lease ran out: allowed, counted.
		h.deliveries = append(h.deliveries, mirDelivery{region: "sg", sub: "ord", id: "SH1", body: "hz-p0-s1", queue: 1, offset: 1})
		return h
	}
	st, problems := checkMirror(clean())
	if len(problems) > 0 {
		t.Fatalf("clean record reported: %q", problems)
	}
	if st.acked != 3 || st.stored["hz"] != 4 || st.stored["sg"] != 4 || st.copies["hz"] != 1 || st.copies["sg"] != 3 || st.redelivs != 1 {
		t.Errorf("clean record: %v", st)
	}

	dropStored := func(h *mirHistory, region, id string) {
		h.stored[region] = slices.DeleteFunc(h.stored[region], func(m mirStored) bool { return m.id == id })
	}
	for _, tc := range []struct {
		name  string
		spoil func(h *mirHistory)
		want  string
	}{
		{"acked message lost at the source", func(h *mirHistory) {
			dropStored(h, "hz", "H1")
		}, "acknowledged message not stored in its own region"},
		{"acked message not copied", func(h *mirHistory) { dropStored(h, "sg", "SH1") }, "hz → sg: hz-p0-s1 (H1"},
		{"unacknowledged but stored message not copied", func(h *mirHistory) { dropStored(h, "sg", "SH2") }, "not copied"},
		{"copied twice (the skip record lost after the dedup window)", func(h *mirHistory) {
			h.stored["sg"] = append(h.stored["sg"], mirStored{id: "SH1b", body: "hz-p0-s1", key: "hz-p0-k0", queue: 1, offset: 3, bornAt: at(10), storedAt: at(9000), sourceID: "H1", sourceRegion: "hz", path: "hz"})
		}, "stored more than once at the destination"},
		{"ping-pong: a copy copied back", func(h *mirHistory) {
			h.stored["hz"] = append(h.stored["hz"], mirStored{id: "HSH0", body: "hz-p0-s0", key: "hz-p0-k0", queue: 1, offset: 3, bornAt: at(0), storedAt: at(50), sourceID: "SH0", sourceRegion: "sg", path: "hz,sg"})
		}, "hz holds hz-p0-s0 (sent in hz) 2 times"},
		{"copy of nothing", func(h *mirHistory) {
			h.stored["sg"] = append(h.stored["sg"], mirStored{id: "SX", body: "hz-p0-s3", key: "hz-p0-k0", queue: 1, offset: 3, bornAt: at(30), sourceID: "H3", sourceRegion: "hz", path: "hz"})
		}, "names source H3"},
		{"body changed", func(h *mirHistory) { h.stored["sg"][0].body = "hz-p0-s3" }, "copy differs from its source"},
		{"sharding key lost", func(h *mirHistory) { h.stored["sg"][1].key = "" }, "shardingKey"},
		{"path wrong", func(h *mirHistory) { h.stored["sg"][1].path = "sg" }, `mirror.path "sg", want "hz"`},
		{"bornAt not kept", func(h *mirHistory) { h.stored["sg"][1].bornAt = h.stored["sg"][1].storedAt }, "bornAt"},
		{"stored out of order", func(h *mirHistory) {
			s := h.stored["sg"]
			s[0].body, s[1].body = s[1].body, s[0].body
			s[0].sourceID, s[1].sourceID = s[1].sourceID, s[0].sourceID
			s[0].bornAt, s[1].bornAt = s[1].bornAt, s[0].bornAt
		}, "per-key order not kept in storage"},
		{"key in two queues", func(h *mirHistory) { h.stored["sg"][2].queue = 2 }, "in queues 1 and 2"},
		{"a message in a region no mirror feeds", func(h *mirHistory) {
			h.routes = h.routes[:1] // hz → sg only: hz's copy of sg-p0-s0 is a stray
		}, "no mirror brings sg's messages there"},
		{"unknown body", func(h *mirHistory) { h.stored["sg"][3].body = "garbage" }, "no producer sent"},
		{"never delivered", func(h *mirHistory) { h.deliveries = h.deliveries[1:] }, "sg/ord: hz-p0-s0 (SH0"},
		{"delivered out of order", func(h *mirHistory) {
			h.deliveries[0], h.deliveries[1] = h.deliveries[1], h.deliveries[0]
		}, "orderly subscription out of order"},
		{"nothing acknowledged", func(h *mirHistory) { h.acked = map[string]string{} }, "no send was acknowledged"},
	} {
		h := clean()
		tc.spoil(h)
		_, problems := checkMirror(h)
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
			t.Errorf("%s: not reported (want %q); got %q", tc.name, tc.want, problems)
		}
	}
}
