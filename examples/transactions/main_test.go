package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidemq/tidemq/internal/listenlog"
	"github.com/tidemq/tidemq/sdk"
)

// TestOrdersSurviveKills runs the example as it is meant to run: the real
// broker binary and the order service as separate processes. 1,000 orders,
// a random third failing their local transaction; the service is
// SIGKILLed twice under load and restarted, and orders that got no answer
// are sent again (as a client would). Afterwards, once the check-backs
// have settled every open transaction: each order in the database has
// exactly one message on the topic, delivered at least once to a
// consumer, and no order outside the database has one.
func TestOrdersSurviveKills(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker and the service as processes")
	}
	bins := buildBinaries(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	broker := startProc(t, bins.tidemq, "--addr", "127.0.0.1:0", "--data", filepath.Join(dir, "data"), "--log-level", "info")
	brokerURL := "http://" + waitLine(t, broker, 30*time.Second, func(log string) string { return listenlog.Addr(log) })

	const topic = "orders"
	svcAddr := freeAddr(t)
	dbPath := filepath.Join(dir, "orders.db")
	var services []*proc // every start of the service, for their logs
	startService := func() *proc {
		p := startProc(t, bins.orders, "-broker", brokerURL, "-addr", svcAddr, "-db", dbPath, "-topic", topic,
			"-check-after", "1s", "-settle-delay", "10ms", "-demo", "0")
		waitHealthy(t, p, "http://"+svcAddr+"/healthz", 30*time.Second)
		services = append(services, p)
		return p
	}
	svc := startService()

	client, err := sdk.NewClient(brokerURL, sdk.ClientOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	top, err := client.GetTopic(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	if top.TransactionCheckURL != "http://"+svcAddr+"/tx-check" {
		t.Fatalf("the service set the topic's check URL to %q", top.TransactionCheckURL)
	}
	if _, _, err := client.PutSubscription(ctx, topic, "audit", sdk.SubscriptionConfig{StartFrom: sdk.PositionEarliest}); err != nil {
		t.Fatal(err)
	}
	var (
		dmu       sync.Mutex
		delivered = map[string]int{} // orderId → deliveries
	)
	consumer, err := sdk.NewConsumer(client, topic, "audit", sdk.ConsumerOptions{Concurrency: 8, WaitSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		consumed <- consumer.Run(cctx, func(_ context.Context, m *sdk.PulledMessage) error {
			var b struct{ OrderID string }
			if err := json.Unmarshal([]byte(m.Body), &b); err != nil {
				return sdk.DeadLetter(err)
			}
			dmu.Lock()
			delivered[b.OrderID]++
			dmu.Unlock()
			return nil
		})
	}()
	defer func() {
		stopConsumer()
		if err := <-consumed; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()

	// The orders, and the service killed at a third and two thirds.
	const orders, workers = 1000, 8
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	fail := make([]bool, orders)
	for i := range fail {
		fail[i] = rng.IntN(3) == 0
	}
	answers := make([]int, orders) // the last HTTP status of each order
	var (
		done    atomic.Int64
		retries atomic.Int64
		wg      sync.WaitGroup
		next    atomic.Int64
	)
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= orders || ctx.Err() != nil {
					return
				}
				body, _ := json.Marshal(order{ID: fmt.Sprintf("o-%04d", i), Item: "item", SimulateFailure: fail[i]})
				for attempt := 0; ctx.Err() == nil && attempt < 200; attempt++ {
					status, err := postOrder(ctx, hc, "http://"+svcAddr+"/orders", body)
					if err == nil && status != http.StatusServiceUnavailable && status != http.StatusInternalServerError {
						answers[i] = status
						break
					}
					retries.Add(1)
					time.Sleep(50 * time.Millisecond) // the service is restarting
				}
				done.Add(1)
			}
		})
	}
	// The test reads the database beside the service (WAL: readers do not
	// block its writer) to aim its kills.
	rdb, err := openDB(ctx, dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	kills, aimed := 0, 0
	for _, at := range []int64{orders / 3, 2 * orders / 3} {
		for done.Load() < at && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		// Kill while an order is between its two commits if one is seen
		// within a few seconds: a kill at a random moment lands, as often
		// as not, where every order under way is before its local commit
		// (the workers move in step with the broker's group commits), and
		// then no check has a row to answer commit for.
		if inWindow(ctx, t, rdb, client, topic, 5*time.Second) {
			aimed++
		}
		if err := svc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		svc.wait(t, 10*time.Second)
		kills++
		svc = startService()
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the orders did not finish in time: %d of %d", done.Load(), orders)
	}
	t.Logf("%d orders, %d kills (%d with an order seen between its two commits), %d requests sent again", orders, kills, aimed, retries.Load())

	// One order whose local transaction outlasts the check delay: the
	// check that comes meanwhile is answered "unknown", and the order is
	// placed with its message all the same.
	slow, _ := json.Marshal(order{ID: "o-slow", Item: "item", LocalWorkMs: 2500})
	if status, err := postOrder(ctx, hc, "http://"+svcAddr+"/orders", slow); err != nil || status != http.StatusCreated {
		t.Fatalf("the slow order: %d, %v", status, err)
	}

	// Every open transaction gets settled by the check-backs.
	waitUntil(t, ctx, "no half messages left", func() (bool, string) {
		top, err := client.GetTopic(ctx, topic)
		return err == nil && top.HalfMessages == 0, fmt.Sprintf("%+v %v", top, err)
	})
	stored := map[string]int{} // orderId → stored messages
	for m, err := range client.Messages(ctx, topic, sdk.MessageQuery{}) {
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Keys) != 1 {
			t.Fatalf("message %s has keys %v", m.MessageID, m.Keys)
		}
		stored[m.Keys[0]]++
	}
	waitUntil(t, ctx, "every stored message delivered", func() (bool, string) {
		dmu.Lock()
		defer dmu.Unlock()
		missing := 0
		for id := range stored {
			if delivered[id] == 0 {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d not delivered", missing, len(stored))
	})

	// The database, read once the service has stopped.
	if err := svc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	svc.wait(t, 20*time.Second)
	rows := readOrders(t, dbPath)

	placed, failed, conflicts := 0, 0, 0
	for i := range orders {
		id := fmt.Sprintf("o-%04d", i)
		_, inDB := rows[id]
		switch answers[i] {
		case http.StatusCreated, http.StatusAccepted:
			placed++
			if !inDB {
				t.Errorf("order %s was answered %d but is not in the database", id, answers[i])
			}
		case http.StatusUnprocessableEntity:
			failed++
			if inDB {
				t.Errorf("order %s failed its local transaction but is in the database", id)
			}
		case http.StatusConflict:
			conflicts++ // a retry of an order whose first attempt got through (or was rolled back by a check)
		default:
			t.Errorf("order %s: last answer %d", id, answers[i])
		}
		if fail[i] && inDB {
			t.Errorf("order %s was meant to fail but is in the database", id)
		}
		if inDB && stored[id] != 1 {
			t.Errorf("order %s is in the database with %d stored messages, want 1", id, stored[id])
		}
	}
	for id, n := range stored {
		if _, ok := rows[id]; !ok {
			t.Errorf("order %s is not in the database but has %d stored messages", id, n)
		}
	}
	dmu.Lock()
	for id, n := range delivered {
		if _, ok := rows[id]; !ok {
			t.Errorf("order %s (not in the database) was delivered %d times", id, n)
		}
	}
	dmu.Unlock()
	t.Logf("placed %d, failed locally %d, conflicts on retry %d; %d rows, %d orders with a message", placed, failed, conflicts, len(rows), len(stored))
	if failed < orders/5 || failed > orders/2 {
		t.Errorf("%d orders failed locally; a third of %d were meant to", failed, orders)
	}
	if kills < 2 {
		t.Errorf("the service was killed %d times", kills)
	}
	// The kills left transactions open (8 orders are under way at each),
	// which only the check-backs settled.
	answered := map[string]int{}
	for _, p := range services {
		for line := range strings.Lines(p.log.String()) {
			if strings.Contains(line, `msg="check answered"`) {
				for _, st := range []string{"commit", "rollback", "unknown"} {
					if strings.Contains(line, "status="+st) {
						answered[st]++
					}
				}
			}
		}
	}
	t.Logf("checks answered: %v", answered)
	if answered["commit"] == 0 {
		t.Error("no check-back committed anything: the kills hit no order between its local commit and its message's")
	}
	if answered["unknown"] == 0 {
		t.Error("the slow order's check was not answered unknown")
	}
	if _, ok := rows["o-slow"]; !ok || stored["o-slow"] != 1 {
		t.Errorf("the slow order: in the database %v, %d stored messages", ok, stored["o-slow"])
	}
}

// inWindow waits, up to timeout, until some order's row is in the
// database while its transaction is still open at the broker: the order is
// then between its local commit and its message's commit (the row is read
// first, so the transaction was open after the row was there). It reports
// whether it saw one.
func inWindow(ctx context.Context, t *testing.T, db *sql.DB, client *sdk.Client, topic string, timeout time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		rows := map[string]bool{}
		rs, err := db.QueryContext(ctx, `SELECT tx_id FROM orders`)
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			var tx string
			if err := rs.Scan(&tx); err != nil {
				t.Fatal(err)
			}
			rows[tx] = true
		}
		if err := errors.Join(rs.Err(), rs.Close()); err != nil {
			t.Fatal(err)
		}
		open, err := client.ListTransactions(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		for _, tx := range open {
			if rows[tx.TransactionID] {
				return true
			}
		}
	}
	return false
}

func postOrder(ctx context.Context, hc *http.Client, url string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err // cut short by the kill: no answer
	}
	return resp.StatusCode, nil
}

// readOrders returns the orders table: id → transaction id.
func readOrders(t *testing.T, path string) map[string]string {
	t.Helper()
	db, err := openDB(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rs, err := db.QueryContext(t.Context(), `SELECT id, tx_id FROM orders`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	out := map[string]string{}
	for rs.Next() {
		var id, tx string
		if err := rs.Scan(&id, &tx); err != nil {
			t.Fatal(err)
		}
		out[id] = tx
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ------------------------------------------------------------- processes

type binaries struct{ tidemq, orders string }

// buildBinaries builds the broker and this service into a temp dir.
func buildBinaries(t *testing.T) binaries {
	t.Helper()
	dir := t.TempDir()
	b := binaries{tidemq: filepath.Join(dir, "tidemq"), orders: filepath.Join(dir, "orders")}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	for _, c := range [][]string{{"-o", b.tidemq, "github.com/tidemq/tidemq/cmd/tidemq"}, {"-o", b.orders, "."}} {
		out, err := exec.CommandContext(ctx, "go", append([]string{"build"}, c...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %v: %v\n%s", c, err, out)
		}
	}
	return b
}

type proc struct {
	cmd     *exec.Cmd
	log     *syncBuffer
	done    chan struct{}
	waitErr error
}

// startProc starts a process that the test's end kills if it still runs.
func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), log: &syncBuffer{}, done: make(chan struct{})}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TIDEMQ_") && !strings.HasPrefix(kv, "OTEL_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			s := p.log.String()
			if len(s) > 6000 {
				s = "…" + s[len(s)-6000:]
			}
			t.Logf("%s (pid %d) log:\n%s", filepath.Base(bin), p.cmd.Process.Pid, s)
		}
	})
	return p
}

func (p *proc) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("pid %d still running %v after it was stopped", p.cmd.Process.Pid, timeout)
	}
}

// waitLine waits until find returns something from the process's log.
func waitLine(t *testing.T, p *proc, timeout time.Duration, find func(string) string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if s := find(p.log.String()); s != "" {
			return s
		}
		select {
		case <-p.done:
			t.Fatalf("process exited: %v\n%s", p.waitErr, p.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing found in the log after %v:\n%s", timeout, p.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitHealthy(t *testing.T, p *proc, url string, timeout time.Duration) {
	t.Helper()
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-p.done:
			t.Fatalf("service exited before it was ready: %v\n%s", p.waitErr, p.log.String())
		default:
		}
		if resp, err := hc.Get(url); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy after %v", url, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() (bool, string)) {
	t.Helper()
	for {
		ok, last := cond()
		if ok {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s: %s", what, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
