package gateway_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
)

// countingBody is a request body that counts the bytes the client's
// transport took from it: what the server read, plus what the sockets hold.
type countingBody struct {
	r    io.Reader
	read atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}

func (b *countingBody) Close() error { return nil }

// budgetBatch is a batch of msgs messages of msgBytes letters each.
func budgetBatch(msgs, msgBytes int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"messages":[`)
	for i := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"body":"`)
		b.Write(bytes.Repeat([]byte{'a' + byte(i)}, msgBytes))
		b.WriteString(`"}`)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// budgetServer serves the real wiring with a body budget of budget bytes,
// and reads its gauge through a real metrics SDK reader.
func budgetServer(t *testing.T, budget int64) (*testServer, func() int64) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	ts := startServer(t, serverConfig{core: core.Options{NoSync: true},
		gateway: gateway.Options{BodyBudgetBytes: budget, MeterProvider: mp}})
	used := func() int64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatalf("collect metrics: %v", err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "tidemq.http.body_budget.used" && len(g.DataPoints) == 1 {
					return g.DataPoints[0].Value
				}
			}
		}
		t.Fatal("no gauge tidemq.http.body_budget.used")
		return 0
	}
	return ts, used
}

// freshClient is ts's client on a transport of its own: a new connection,
// so that no socket buffer grown by an earlier body hides how much of a
// refused body the server read. Keep-alive, as producers are: a client
// that sends Connection: close has its connection closed at once after a
// refusal, and may see a reset before the reply.
func freshClient(t *testing.T, ts *testServer) *client {
	c := ts.client(t)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c.hc = &http.Client{Transport: tr, Timeout: 60 * time.Second}
	return c
}

// sendCounted posts body to the batch route through a countingBody.
func sendCounted(ctx context.Context, c *client, topic string, body io.Reader, length int64) (*reply, int64, error) {
	cb := &countingBody{r: body}
	req := c.request(ctx, "POST", batchPath(topic), nil, nil)
	req.Body, req.ContentLength = cb, length
	req.Header.Set("Content-Type", "application/json")
	r, err := c.roundTrip(req)
	return r, cb.read.Load(), err
}

func wantBudgetRefusal(t *testing.T, r *reply) {
	t.Helper()
	wantProblem(t, r, http.StatusTooManyRequests, "too_many_requests")
	if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 {
		t.Errorf("429 with Retry-After %q, want whole seconds", r.header.Get("Retry-After"))
	}
}

// TestBodyBudgetFloodRefusedUnread: concurrent batches of 12 MiB against a
// budget of two and a half of them: the ones past the budget get 429 with
// Retry-After with most of their body never read, the admitted ones are
// stored whole (messages stored == batches answered 201, times their
// length), and the budget is all given back afterwards.
func TestBodyBudgetFloodRefusedUnread(t *testing.T) {
	const msgs, msgBytes, conc = 4, 3 << 20, 8
	payload := budgetBatch(msgs, msgBytes)
	ts, used := budgetServer(t, int64(len(payload))*5/2)
	type result struct {
		r    *reply
		read int64
		err  error
	}
	var created, refused int
	var maxRefusedRead int64
	for round := 0; round < 5 && (created == 0 || refused == 0); round++ {
		results := make([]result, conc)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range conc {
			wg.Go(func() {
				<-start
				r, read, err := sendCounted(t.Context(), freshClient(t, ts), "flood", bytes.NewReader(payload), int64(len(payload)))
				results[i] = result{r, read, err}
			})
		}
		close(start)
		wg.Wait()
		for i, res := range results {
			switch {
			case res.err != nil:
				t.Fatalf("round %d request %d: %v", round, i, res.err)
			case res.r.status == http.StatusCreated:
				created++
				if res.read != int64(len(payload)) {
					t.Errorf("a stored batch's body was read %d of %d bytes", res.read, len(payload))
				}
			case res.r.status == http.StatusTooManyRequests:
				refused++
				maxRefusedRead = max(maxRefusedRead, res.read)
				wantBudgetRefusal(t, res.r)
				// The sockets on loopback hold a few MiB; the server
				// itself read only the headers and what net/http drains
				// (at most 256 KiB) before it closed the connection.
				if res.read >= int64(len(payload))*3/4 {
					t.Errorf("a refused batch's body was read %d of %d bytes: refused after reading it", res.read, len(payload))
				}
			default:
				t.Fatalf("round %d request %d: %s", round, i, res.r)
			}
		}
	}
	if created == 0 || refused == 0 {
		t.Fatalf("%d batches stored and %d refused over the rounds; want some of each", created, refused)
	}
	if got := ts.client(t).getTopic("flood").Messages; got != int64(created*msgs) {
		t.Errorf("topic holds %d messages; %d batches of %d were answered 201", got, created, msgs)
	}
	eventually(t, 5*time.Second, func() error {
		if u := used(); u != 0 {
			return fmt.Errorf("%d bytes of the body budget still held", u)
		}
		return nil
	})
	t.Logf("%d batches stored, %d refused (at most %d of a refused body's %d bytes taken by the sockets and the server)", created, refused, maxRefusedRead, len(payload))
}

// TestBodyBudgetHeldWhileRead: a request whose body is still arriving
// holds its Content-Length; meanwhile another with a Content-Length, and a
// chunked one (reserved as it is read), are refused with most of their
// body unread, and the connection of a small refused request stays
// usable. Once the first body ends it is stored and the budget is back to
// 0; a body larger than the whole budget, sent alone, is stored.
func TestBodyBudgetHeldWhileRead(t *testing.T) {
	const budget = 1 << 20
	ts, used := budgetServer(t, budget)
	c := freshClient(t, ts)

	held := budgetBatch(1, budget-36) // 10 bytes short of the budget
	pr, pw := io.Pipe()
	type result struct {
		r   *reply
		err error
	}
	first := make(chan result, 1)
	go func() {
		r, _, err := sendCounted(t.Context(), c, "held", pr, int64(len(held)))
		first <- result{r, err}
	}()
	if _, err := pw.Write(held[:len(held)/2]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, func() error {
		if u := used(); u != int64(len(held)) {
			return fmt.Errorf("budget in use %d, want the held body's %d", u, len(held))
		}
		return nil
	})

	// Large against what loopback sockets buffer (several MB), so that
	// "mostly unread" can be told from "read".
	big := budgetBatch(4, 3<<20)
	r, read, err := sendCounted(t.Context(), freshClient(t, ts), "held", bytes.NewReader(big), int64(len(big)))
	if err != nil {
		t.Fatal(err)
	}
	wantBudgetRefusal(t, r)
	if read >= int64(len(big))*3/4 {
		t.Errorf("refused with Content-Length after %d of %d bytes were read", read, len(big))
	}
	// No Content-Length: io.MultiReader hides the length, so the
	// transport sends it chunked.
	r, read, err = sendCounted(t.Context(), freshClient(t, ts), "held", io.MultiReader(bytes.NewReader(big)), -1)
	if err != nil {
		t.Fatal(err)
	}
	wantBudgetRefusal(t, r)
	if read >= int64(len(big))*3/4 {
		t.Errorf("chunked: refused after %d of %d bytes were read", read, len(big))
	}

	// A small refused body is drained by net/http: the connection serves
	// the next request.
	kept := ts.client(t)
	small := `{"messages":[{"body":"x"}]}`
	var reused atomic.Bool
	trace := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused.Store(i.Reused) }})
	sendSmall := func() *reply {
		r, err := kept.roundTrip(kept.request(trace, "POST", batchPath("held"), small, nil))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	wantBudgetRefusal(t, sendSmall())
	if u := used(); u != int64(len(held)) {
		t.Errorf("refusals changed the budget in use: %d, want %d", u, len(held))
	}

	if _, err := pw.Write(held[len(held)/2:]); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	res := <-first
	if res.err != nil {
		t.Fatal(res.err)
	}
	wantStatus(t, res.r, http.StatusCreated)
	eventually(t, 5*time.Second, func() error {
		if u := used(); u != 0 {
			return fmt.Errorf("%d bytes of the body budget still held", u)
		}
		return nil
	})
	wantStatus(t, sendSmall(), http.StatusCreated)
	if !reused.Load() {
		t.Error("the connection of a small refused request was not kept")
	}

	// Alone, a body over the whole budget goes through, with and
	// without a Content-Length.
	r, _, err = sendCounted(t.Context(), c, "held", bytes.NewReader(big), int64(len(big)))
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, r, http.StatusCreated)
	r, _, err = sendCounted(t.Context(), c, "held", io.MultiReader(bytes.NewReader(big)), -1)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, r, http.StatusCreated)
	if got, want := c.getTopic("held").Messages, int64(1+1+4+4); got != want {
		t.Errorf("topic holds %d messages, want %d", got, want)
	}
	if u := used(); u != 0 {
		t.Errorf("budget in use %d after every request was answered", u)
	}
}

// TestBodyOverLimitRefusedUnread: a Content-Length over the request limit
// is answered 413 without the body being read.
func TestBodyOverLimitRefusedUnread(t *testing.T) {
	ts, _ := budgetServer(t, gateway.DefaultBodyBudgetBytes)
	c := freshClient(t, ts)
	length := int64(gateway.DefaultMaxRequestBytes) + 1
	r, read, err := sendCounted(t.Context(), c, "huge", io.LimitReader(strings.NewReader(strings.Repeat("z", int(length))), length), length)
	if err != nil {
		t.Fatal(err)
	}
	wantProblem(t, r, http.StatusRequestEntityTooLarge, "request_too_large")
	if read >= length*3/4 {
		t.Errorf("refused after %d of %d bytes were read", read, length)
	}
}
