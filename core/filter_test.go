package core_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tidemq/tidemq/core"
)

var filterCases = []struct {
	expr  string
	valid bool
}{
	{"", true},
	{"*", true},
	{" * ", true},
	{"A", true},
	{"TagA", true},
	{"A || B", true},
	{"A||B", true},
	{"  A  ||  B  ", true},
	{"A || B || C", true},
	{"order.created_v2-eu", true},
	{strings.Repeat("t", core.MaxTagLen), true},
	{"A ||", false},
	{"|| B", false},
	{"||", false},
	{"A | B", false},
	{"A B", false},
	{"A\tB", false},
	{"A || || B", false},
	{"A || *", false},
	{"* || A", false},
	{"A |||| B", false},
	{strings.Repeat("t", core.MaxTagLen+1), false},
}

func TestParseFilter(t *testing.T) {
	for _, tc := range filterCases {
		_, err := core.ParseFilter(tc.expr)
		switch {
		case tc.valid && err != nil:
			t.Errorf("ParseFilter(%q) = %v, want valid", tc.expr, err)
		case !tc.valid && !errors.Is(err, core.ErrInvalidFilter):
			t.Errorf("ParseFilter(%q) = %v, want ErrInvalidFilter", tc.expr, err)
		}
	}
}

func FuzzParseFilter(f *testing.F) {
	for _, tc := range filterCases {
		f.Add(tc.expr)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		_, err := core.ParseFilter(expr)
		if err != nil && !errors.Is(err, core.ErrInvalidFilter) {
			t.Fatalf("ParseFilter(%q) = %v: not an ErrInvalidFilter", expr, err)
		}
		// Surrounding white space never changes the verdict.
		if _, err2 := core.ParseFilter(" " + expr + "\t"); (err == nil) != (err2 == nil) {
			t.Fatalf("ParseFilter(%q) = %v but with spaces around %v", expr, err, err2)
		}
	})
}

func TestFilteredSubscriptionsGetOnlyTheirTags(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 4)
	for _, s := range [][2]string{{"a", "TagA"}, {"ab", "TagA || TagB"}, {"all", "*"}, {"none", "TagZ"}} {
		e.subscribe("orders", s[0], core.SubscriptionConfig{Filter: s[1]})
	}
	var msgs []*core.Message
	want := map[string][]string{}
	for i := range 40 {
		tag := []string{"TagA", "TagB", "", "TagAB"}[i%4]
		body := fmt.Sprintf("%s-%02d", tag, i)
		msgs = append(msgs, &core.Message{Body: []byte(body), Tag: tag})
		want["all"] = append(want["all"], body)
		if tag == "TagA" {
			want["a"] = append(want["a"], body)
		}
		if tag == "TagA" || tag == "TagB" {
			want["ab"] = append(want["ab"], body)
		}
	}
	e.sendBatch("orders", msgs...)
	for _, g := range []string{"a", "ab", "all", "none"} {
		got := e.drain("orders", g, core.PullRequest{MaxMessages: 7})
		w := slices.Clone(want[g])
		slices.Sort(w)
		if !slices.Equal(bodies(got), w) {
			t.Errorf("%s got %v, want %v", g, bodies(got), w)
		}
		e.ackAll("orders", g, got)
		// Filtered-out messages count as acked.
		info := e.subInfo("orders", g)
		if info.Lag != 0 || info.Inflight != 0 {
			t.Errorf("%s: lag=%d inflight=%d after acking what it got", g, info.Lag, info.Inflight)
		}
		for _, q := range info.Queues {
			if q.AckedOffset != q.MaxOffset {
				t.Errorf("%s queue %d: acked %d of %d", g, q.QueueID, q.AckedOffset, q.MaxOffset)
			}
		}
	}
}

// Tags are matched by a 32-bit hash in the index first; a tag that only
// collides with the filter's must still be left out once the body is read.
func TestFilterHashCollisionIsNotDelivered(t *testing.T) {
	// Found by hashing "t%x" for i = 0, 1, 2, … until two collided.
	tagX, tagY := "t16efa", "t88dc0"
	if core.TagHash(tagX) != core.TagHash(tagY) {
		t.Fatalf("%q and %q no longer collide: TagHash changed", tagX, tagY)
	}
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{Filter: tagX})
	e.sendBatch("orders",
		&core.Message{Body: []byte("impostor-1"), Tag: tagY},
		&core.Message{Body: []byte("wanted"), Tag: tagX},
		&core.Message{Body: []byte("impostor-2"), Tag: tagY},
	)
	got := e.drain("orders", "g", core.PullRequest{})
	if !slices.Equal(bodies(got), []string{"wanted"}) {
		t.Fatalf("filter %q (hash %08x) delivered %v; %q has the same hash", tagX, core.TagHash(tagX), bodies(got), tagY)
	}
	e.ackAll("orders", "g", got)
	if info := e.subInfo("orders", "g"); info.Lag != 0 || info.Inflight != 0 {
		t.Errorf("lag=%d inflight=%d: the impostors should count as done", info.Lag, info.Inflight)
	}
}

func TestTagHash(t *testing.T) {
	if core.TagHash("") != 0 {
		t.Error("TagHash of no tag is not 0")
	}
	for _, tag := range []string{"a", "TagA", "TagB", strings.Repeat("x", 64)} {
		if core.TagHash(tag) == 0 {
			t.Errorf("TagHash(%q) = 0, which means no tag", tag)
		}
	}
	if core.TagHash("TagA") == core.TagHash("TagB") {
		t.Error("TagA and TagB hash alike")
	}
}
