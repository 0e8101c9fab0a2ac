package core_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// clock is an injectable time source for lease and store-time tests. Pull's
// long-poll wait uses real timers, so tests that advance it pull with Wait 0.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock {
	return &clock{now: time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is a broker over real Pebble on an in-memory FS that survives restart.
type env struct {
	t     testing.TB
	fs    vfs.FS
	opts  core.Options
	store *pebblestore.Store
	b     *core.Broker
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// newEnv opens a store on vfs.NewMem() and a broker over it; both are
// closed, with their errors checked, when the test ends.
func newEnv(t testing.TB, opts core.Options) *env {
	t.Helper()
	return newEnvOn(t, vfs.NewMem(), opts)
}

func newEnvOn(t testing.TB, fs vfs.FS, opts core.Options) *env {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if opts.ReceiptKey == nil {
		// One key across restarts, as a node keeps it in its data
		// directory, so that handles outlive a restart.
		opts.ReceiptKey = []byte("core-test-receipt-key")
	}
	e := &env{t: t, fs: fs, opts: opts}
	e.open()
	t.Cleanup(e.close)
	return e
}

func (e *env) open() {
	e.t.Helper()
	store, err := pebblestore.Open("db", pebblestore.Options{FS: e.fs, Logger: e.opts.Logger})
	if err != nil {
		e.t.Fatalf("pebblestore.Open: %v", err)
	}
	b, err := core.New(store, e.opts)
	if err != nil {
		_ = store.Close()
		e.t.Fatalf("core.New: %v", err)
	}
	e.store, e.b = store, b
}

func (e *env) close() {
	e.t.Helper()
	if e.b == nil {
		return
	}
	if err := e.b.Close(); err != nil {
		e.t.Errorf("broker Close: %v", err)
	}
	if err := e.store.Close(); err != nil {
		e.t.Errorf("store Close: %v", err)
	}
	e.b, e.store = nil, nil
}

// restart closes broker and store and opens both again on the same FS.
func (e *env) restart() {
	e.t.Helper()
	e.close()
	e.open()
}

func (e *env) putTopic(name string, queues int) core.TopicInfo {
	e.t.Helper()
	info, _, err := e.b.PutTopic(e.t.Context(), name, core.TopicConfig{Queues: queues})
	if err != nil {
		e.t.Fatalf("PutTopic(%s): %v", name, err)
	}
	return info
}

func (e *env) subscribe(topic, group string, cfg core.SubscriptionConfig) core.SubscriptionInfo {
	e.t.Helper()
	info, _, err := e.b.PutSubscription(e.t.Context(), topic, group, cfg)
	if err != nil {
		e.t.Fatalf("PutSubscription(%s/%s): %v", topic, group, err)
	}
	return info
}

// send stores one message per body, one Send call per message.
func (e *env) send(topic string, bodies ...string) []core.SendResult {
	e.t.Helper()
	var out []core.SendResult
	for _, body := range bodies {
		res, err := e.b.Send(e.t.Context(), topic, []*core.Message{{Body: []byte(body)}})
		if err != nil {
			e.t.Fatalf("Send(%s, %q): %v", topic, body, err)
		}
		out = append(out, res...)
	}
	return out
}

// sendBatch stores msgs with one Send call.
func (e *env) sendBatch(topic string, msgs ...*core.Message) []core.SendResult {
	e.t.Helper()
	res, err := e.b.Send(e.t.Context(), topic, msgs)
	if err != nil {
		e.t.Fatalf("Send(%s, %d messages): %v", topic, len(msgs), err)
	}
	if len(res) != len(msgs) {
		e.t.Fatalf("Send returned %d results for %d messages", len(res), len(msgs))
	}
	return res
}

func (e *env) pull(topic, group string, req core.PullRequest) []core.Delivered {
	e.t.Helper()
	got, err := e.b.Pull(e.t.Context(), topic, group, req)
	if err != nil {
		e.t.Fatalf("Pull(%s/%s): %v", topic, group, err)
	}
	return got
}

// drain pulls with Wait 0 until a pull comes back empty.
func (e *env) drain(topic, group string, req core.PullRequest) []core.Delivered {
	e.t.Helper()
	req.Wait = 0
	var all []core.Delivered
	for range 10000 {
		got := e.pull(topic, group, req)
		if len(got) == 0 {
			return all
		}
		all = append(all, got...)
	}
	e.t.Fatalf("drain(%s/%s): pulls never came back empty", topic, group)
	return nil
}

// ack acks handles and fails the test if the call itself fails.
func (e *env) ack(topic, group string, handles ...string) (int, []core.HandleResult) {
	e.t.Helper()
	n, failed, err := e.b.Ack(e.t.Context(), topic, group, handles)
	if err != nil {
		e.t.Fatalf("Ack(%s/%s): %v", topic, group, err)
	}
	return n, failed
}

// ackAll acks every delivery and fails the test unless all count.
func (e *env) ackAll(topic, group string, ds []core.Delivered) {
	e.t.Helper()
	if len(ds) == 0 {
		return
	}
	n, failed := e.ack(topic, group, handles(ds)...)
	if n != len(ds) || len(failed) != 0 {
		e.t.Fatalf("Ack of %d handles: acked %d, failed %v", len(ds), n, failed)
	}
}

func (e *env) topicInfo(name string) core.TopicInfo {
	e.t.Helper()
	info, err := e.b.GetTopic(name)
	if err != nil {
		e.t.Fatalf("GetTopic(%s): %v", name, err)
	}
	return info
}

func (e *env) subInfo(topic, group string) core.SubscriptionInfo {
	e.t.Helper()
	info, err := e.b.GetSubscription(topic, group)
	if err != nil {
		e.t.Fatalf("GetSubscription(%s/%s): %v", topic, group, err)
	}
	return info
}

func handles(ds []core.Delivered) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ReceiptHandle
	}
	return out
}

// bodies returns the delivered bodies, sorted.
func bodies(ds []core.Delivered) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Message.Body)
	}
	slices.Sort(out)
	return out
}

// pos names a message by queue and offset.
type pos struct {
	queue  uint32
	offset uint64
}

func (p pos) String() string { return fmt.Sprintf("%d@%d", p.queue, p.offset) }

// positions returns where the delivered messages are, sorted.
func positions(ds []core.Delivered) []pos {
	out := make([]pos, len(ds))
	for i, d := range ds {
		out[i] = pos{d.Message.QueueID, d.Message.Offset}
	}
	slices.SortFunc(out, func(a, b pos) int {
		if a.queue != b.queue {
			return int(a.queue) - int(b.queue)
		}
		return int(a.offset) - int(b.offset)
	})
	return out
}

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return out
}

func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("err = %v, want %v", err, target)
	}
}

// wantValidation checks err is a *core.ValidationError for field (any field
// when empty) and batch entry.
func wantValidation(t testing.TB, err error, field string, entry int) *core.ValidationError {
	t.Helper()
	var ve *core.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err = %v (%T), want *core.ValidationError", err, err)
	}
	if field != "" && ve.Field != field {
		t.Errorf("ValidationError.Field = %q, want %q", ve.Field, field)
	}
	if ve.Entry != entry {
		t.Errorf("ValidationError.Entry = %d, want %d", ve.Entry, entry)
	}
	return ve
}
