package core_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tidemq/tidemq/core"
)

func TestPutTopicCreatesWithDefaults(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})

	info, created, err := e.b.PutTopic(t.Context(), "orders", core.TopicConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Error("created = false for a new topic")
	}
	if info.Name != "orders" || info.Queues != 8 || info.RetentionHours != 24 {
		t.Errorf("info = %+v, want orders with SPEC's defaults of 8 queues and 24h retention", info)
	}
	if len(info.QueueStats) != 8 {
		t.Fatalf("%d queue stats, want 8", len(info.QueueStats))
	}
	for i, q := range info.QueueStats {
		if q != (core.QueueStat{QueueID: i}) {
			t.Errorf("queue stat %d = %+v, want empty queue %d", i, q, i)
		}
	}
	if !info.CreatedAt.Equal(clk.Now()) {
		t.Errorf("CreatedAt = %v, want %v", info.CreatedAt, clk.Now())
	}
	if info.Messages != 0 || info.Bytes != 0 || len(info.Subscriptions) != 0 {
		t.Errorf("new topic not empty: %+v", info)
	}
}

func TestPutTopicGrowsNeverShrinks(t *testing.T) {
	e := newEnv(t, core.Options{})
	ctx := t.Context()
	if _, created, err := e.b.PutTopic(ctx, "orders", core.TopicConfig{Queues: 4, RetentionHours: 2}); err != nil || !created {
		t.Fatalf("create: created=%v err=%v", created, err)
	}

	info, created, err := e.b.PutTopic(ctx, "orders", core.TopicConfig{Queues: 6})
	if err != nil {
		t.Fatal(err)
	}
	if created {
		t.Error("created = true for an existing topic")
	}
	if info.Queues != 6 || len(info.QueueStats) != 6 {
		t.Errorf("after growing to 6: queues=%d stats=%d", info.Queues, len(info.QueueStats))
	}
	if info.RetentionHours != 2 {
		t.Errorf("retention changed to %d by a request that did not set it", info.RetentionHours)
	}

	// Zero fields leave the topic as it is.
	info, created, err = e.b.PutTopic(ctx, "orders", core.TopicConfig{})
	if err != nil || created || info.Queues != 6 {
		t.Errorf("PutTopic with zero config: queues=%d created=%v err=%v, want 6 false nil", info.Queues, created, err)
	}

	_, _, err = e.b.PutTopic(ctx, "orders", core.TopicConfig{Queues: 5})
	wantErr(t, err, core.ErrQueueCountDecrease)
	if got := e.topicInfo("orders").Queues; got != 6 {
		t.Errorf("queues = %d after a refused shrink, want 6", got)
	}

	info, _, err = e.b.PutTopic(ctx, "orders", core.TopicConfig{Queues: 6, RetentionHours: 48})
	if err != nil || info.RetentionHours != 48 {
		t.Errorf("retention update: %d, %v; want 48", info.RetentionHours, err)
	}

	e.restart()
	if info := e.topicInfo("orders"); info.Queues != 6 || info.RetentionHours != 48 {
		t.Errorf("after restart: %d queues, %dh; want 6 and 48h", info.Queues, info.RetentionHours)
	}
}

func TestTopicNames(t *testing.T) {
	e := newEnv(t, core.Options{AutoCreate: true})
	ctx := t.Context()
	for _, name := range []string{
		"", "-orders", ".orders", "_orders", "or ders", "or/ders", "orders!", "ördes", "or\x00ders",
		strings.Repeat("a", 128),
	} {
		_, _, err := e.b.PutTopic(ctx, name, core.TopicConfig{})
		wantErr(t, err, core.ErrInvalidName)
		_, err = e.b.GetTopic(name)
		wantErr(t, err, core.ErrInvalidName)
		_, err = e.b.Send(ctx, name, []*core.Message{{Body: []byte("x")}})
		wantErr(t, err, core.ErrInvalidName)
	}
	for _, name := range []string{"a", "0", "Orders.v2_eu-west", strings.Repeat("z", 127)} {
		if _, created, err := e.b.PutTopic(ctx, name, core.TopicConfig{}); err != nil || !created {
			t.Errorf("PutTopic(%q): created=%v err=%v", name, created, err)
		}
	}
	if n := len(e.b.ListTopics()); n != 4 {
		t.Errorf("%d topics listed, want the 4 valid ones", n)
	}
}

func TestPutTopicRejectsOutOfRangeConfig(t *testing.T) {
	e := newEnv(t, core.Options{})
	for _, tc := range []struct {
		cfg   core.TopicConfig
		field string
	}{
		{core.TopicConfig{Queues: -1}, "/queues"},
		{core.TopicConfig{Queues: core.MaxQueues + 1}, "/queues"},
		{core.TopicConfig{RetentionHours: -1}, "/retentionHours"},
		{core.TopicConfig{RetentionHours: core.MaxRetentionHours + 1}, "/retentionHours"},
	} {
		_, _, err := e.b.PutTopic(t.Context(), "orders", tc.cfg)
		wantValidation(t, err, tc.field, -1)
	}
	if n := len(e.b.ListTopics()); n != 0 {
		t.Errorf("%d topics after only bad requests", n)
	}
}

func TestGetTopicCounts(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 3)
	perQueue := make([]uint64, 3)
	var bytes int64
	for i := range 10 {
		body := strings.Repeat("x", i+1)
		bytes += int64(len(body))
		res := e.send("orders", body)
		perQueue[res[0].QueueID]++
	}
	e.subscribe("orders", "g2", core.SubscriptionConfig{})
	e.subscribe("orders", "g1", core.SubscriptionConfig{})

	info := e.topicInfo("orders")
	if info.Messages != 10 || info.Bytes != bytes {
		t.Errorf("messages=%d bytes=%d, want 10 and %d", info.Messages, info.Bytes, bytes)
	}
	for i, q := range info.QueueStats {
		if q.QueueID != i || q.MinOffset != 0 || q.MaxOffset != perQueue[i] {
			t.Errorf("queue %d stat %+v, want [0, %d)", i, q, perQueue[i])
		}
	}
	if !slices.Equal(info.Subscriptions, []string{"g1", "g2"}) {
		t.Errorf("subscriptions = %v, want [g1 g2]", info.Subscriptions)
	}

	_, err := e.b.GetTopic("missing")
	wantErr(t, err, core.ErrTopicNotFound)
}

func TestListTopicsSortedWithCounts(t *testing.T) {
	e := newEnv(t, core.Options{})
	for _, name := range []string{"zeta", "alpha", "mid"} {
		e.putTopic(name, 2)
	}
	e.send("mid", "a", "bb", "ccc")
	e.send("zeta", "dddd")

	list := e.b.ListTopics()
	var names []string
	for _, ti := range list {
		names = append(names, ti.Name)
	}
	if !slices.Equal(names, []string{"alpha", "mid", "zeta"}) {
		t.Fatalf("ListTopics names = %v, want sorted [alpha mid zeta]", names)
	}
	want := map[string][2]int64{"alpha": {0, 0}, "mid": {3, 6}, "zeta": {1, 4}}
	for _, ti := range list {
		if w := want[ti.Name]; ti.Messages != w[0] || ti.Bytes != w[1] {
			t.Errorf("%s: messages=%d bytes=%d, want %d %d", ti.Name, ti.Messages, ti.Bytes, w[0], w[1])
		}
	}
}

func TestDeleteTopic(t *testing.T) {
	e := newEnv(t, core.Options{})
	ctx := t.Context()
	e.putTopic("orders", 2)
	e.send("orders", "old-1", "old-2", "old-3")
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	leased := e.pull("orders", "g", core.PullRequest{MaxMessages: 1})

	if err := e.b.DeleteTopic(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	_, err := e.b.GetTopic("orders")
	wantErr(t, err, core.ErrTopicNotFound)
	_, err = e.b.GetSubscription("orders", "g")
	wantErr(t, err, core.ErrTopicNotFound)
	_, err = e.b.Send(ctx, "orders", []*core.Message{{Body: []byte("x")}})
	wantErr(t, err, core.ErrTopicNotFound)
	_, _, err = e.b.Ack(ctx, "orders", "g", handles(leased))
	wantErr(t, err, core.ErrTopicNotFound)
	wantErr(t, e.b.DeleteTopic(ctx, "orders"), core.ErrTopicNotFound)
	if n := len(e.b.ListTopics()); n != 0 {
		t.Errorf("%d topics listed after delete", n)
	}

	// A topic made again under the same name starts empty.
	info, created, err := e.b.PutTopic(ctx, "orders", core.TopicConfig{Queues: 2})
	if err != nil || !created {
		t.Fatalf("re-create: created=%v err=%v", created, err)
	}
	if info.Messages != 0 || info.Bytes != 0 || len(info.Subscriptions) != 0 {
		t.Errorf("re-created topic not empty: %+v", info)
	}
	res := e.send("orders", "new")
	if res[0].Offset != 0 {
		t.Errorf("first message of the re-created topic at offset %d, want 0", res[0].Offset)
	}
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	if got := bodies(e.drain("orders", "g", core.PullRequest{})); !slices.Equal(got, []string{"new"}) {
		t.Errorf("re-created topic delivers %v, want [new]", got)
	}

	// And the old messages do not come back from disk.
	e.restart()
	if info := e.topicInfo("orders"); info.Messages != 1 {
		t.Errorf("after restart: %d messages, want 1", info.Messages)
	}
	e.subscribe("orders", "fresh", core.SubscriptionConfig{StartFrom: "earliest"})
	if got := bodies(e.drain("orders", "fresh", core.PullRequest{})); !slices.Equal(got, []string{"new"}) {
		t.Errorf("after restart a new subscription gets %v, want [new]", got)
	}
}

func TestGrowQueuesFeedsExistingSubscriptions(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "g", core.SubscriptionConfig{})
	e.send("orders", "before")
	if _, _, err := e.b.PutTopic(t.Context(), "orders", core.TopicConfig{Queues: 4}); err != nil {
		t.Fatal(err)
	}
	res := e.send("orders", numbered("after-", 8)...)
	used := map[int]bool{}
	for _, r := range res {
		used[r.QueueID] = true
	}
	if len(used) != 4 {
		t.Errorf("sends after growing used queues %v, want all 4", used)
	}
	got := e.drain("orders", "g", core.PullRequest{})
	if len(got) != 9 {
		t.Fatalf("pulled %d messages, want 9: %v", len(got), bodies(got))
	}
	e.ackAll("orders", "g", got)
	info := e.subInfo("orders", "g")
	if len(info.Queues) != 4 || info.Lag != 0 {
		t.Errorf("subscription sees %d queues with lag %d, want 4 and 0", len(info.Queues), info.Lag)
	}
}

// TestDeletedTopicsBodiesGoAtTheNextLogCut: deleting a topic drops its
// indexes at once and leaves its bodies in the shared log until retention
// cuts the log past them; the next retention pass does, even when no
// queue has anything to expire, and a remaining topic's bodies stay.
func TestDeletedTopicsBodiesGoAtTheNextLogCut(t *testing.T) {
	e := newEnv(t, core.Options{})
	ctx := t.Context()
	e.putTopic("orders", 2)
	e.send("orders", "a", "b", "c")
	e.putTopic("keep", 1)
	kept := e.send("keep", "k")
	bodyAt := func(seq uint64) string {
		t.Helper()
		m, err := e.store.ReadMessage(seq)
		if errors.Is(err, core.ErrMessageNotFound) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(m.Body)
	}
	for seq, want := range []string{"a", "b", "c", "k"} {
		if got := bodyAt(uint64(seq)); got != want {
			t.Fatalf("seq %d holds %q, want %q", seq, got, want)
		}
	}

	if err := e.b.DeleteTopic(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	if err := e.b.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	for seq := range uint64(3) {
		if got := bodyAt(seq); got != "" {
			t.Errorf("seq %d of the deleted topic still holds %q after retention", seq, got)
		}
	}
	if got := bodyAt(3); got != "k" {
		t.Errorf("the kept topic's body at seq 3 = %q", got)
	}
	if m, _, err := e.b.GetMessage("keep", kept[0].MessageID); err != nil || string(m.Body) != "k" {
		t.Errorf("GetMessage of the kept topic's message: %+v, %v", m, err)
	}

	// With no topic left, the cut reaches everything stored.
	if err := e.b.DeleteTopic(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	if err := e.b.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	if got := bodyAt(3); got != "" {
		t.Errorf("seq 3 still holds %q with no topic left", got)
	}
}
