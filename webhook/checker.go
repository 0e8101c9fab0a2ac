package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/tidemq/tidemq/core"
)

var _ core.TransactionChecker = (*Checker)(nil)

// CheckerOptions configures a Checker. The zero value works.
type CheckerOptions struct {
	Logger *slog.Logger
	Client *http.Client
	// Timeout bounds one check (default 10s).
	Timeout time.Duration
	// OpenFor is how long a breaker stays open before a probe (default 5s).
	OpenFor time.Duration
}

// Checker asks producers about undecided transactions (SPEC §9): it POSTs
// {"topic","transactionId","messageIds","producerGroup","check"} to the
// topic's transactionCheckUrl and reads {"status":"commit"|"rollback"|"unknown"}.
// Each URL has its own breaker: while a producer is down its checks fail
// at once instead of each waiting for a timeout (the broker asks again
// later, its delay doubling, which is the backoff). It keeps no
// goroutines; a check's context stops it.
type Checker struct {
	opts     CheckerOptions
	log      *slog.Logger
	mu       sync.Mutex
	breakers map[string]*gobreaker.CircuitBreaker[string]
}

// NewChecker makes a Checker.
func NewChecker(opts CheckerOptions) *Checker {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Client == nil {
		opts.Client = &http.Client{}
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.OpenFor <= 0 {
		opts.OpenFor = 5 * time.Second
	}
	return &Checker{opts: opts, log: opts.Logger.With("component", "transaction_check"), breakers: map[string]*gobreaker.CircuitBreaker[string]{}}
}

// checkPayload is the check's body (SPEC §9).
type checkPayload struct {
	Topic         string   `json:"topic"`
	TransactionID string   `json:"transactionId"`
	MessageIDs    []string `json:"messageIds"`
	ProducerGroup string   `json:"producerGroup"`
	Check         int      `json:"check"`
}

// CheckTransaction POSTs one check and returns the producer's status.
func (c *Checker) CheckTransaction(ctx context.Context, url string, tc core.TransactionCheck) (string, error) {
	return c.breaker(url).Execute(func() (string, error) { return c.post(ctx, url, tc) })
}

func (c *Checker) breaker(url string) *gobreaker.CircuitBreaker[string] {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.breakers[url]
	if b == nil {
		b = newBreaker[string](c.log, url, 3, c.opts.OpenFor)
		c.breakers[url] = b
	}
	return b
}

func (c *Checker) post(ctx context.Context, url string, tc core.TransactionCheck) (string, error) {
	body, err := json.Marshal(checkPayload{Topic: tc.Topic, TransactionID: tc.TransactionID, MessageIDs: tc.MessageIDs,
		ProducerGroup: tc.ProducerGroup, Check: tc.Check})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tidemq-transaction-check/1")
	resp, err := c.opts.Client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("transaction check %s answered %s", url, resp.Status)
	}
	var reply struct {
		Status string `json:"status"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&reply); err != nil {
		return "", fmt.Errorf("transaction check %s: reply: %w", url, err)
	}
	switch reply.Status {
	case core.CheckCommit, core.CheckRollback, core.CheckUnknown:
		return reply.Status, nil
	}
	return "", fmt.Errorf("transaction check %s: status %q is none of commit, rollback, unknown", url, reply.Status)
}

// newBreaker is an endpoint's breaker: open after failures in a row, one
// probe after openFor.
func newBreaker[T any](log *slog.Logger, url string, failures uint32, openFor time.Duration) *gobreaker.CircuitBreaker[T] {
	return gobreaker.NewCircuitBreaker[T](gobreaker.Settings{
		Name:        url,
		MaxRequests: 1,
		Timeout:     openFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= failures },
		OnStateChange: func(name string, from, to gobreaker.State) {
			log.Info("webhook breaker", "url", name, "from", from.String(), "to", to.String())
		},
	})
}
