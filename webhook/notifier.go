package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/tidemq/tidemq/core"
)

var _ core.Notifier = (*Notifier)(nil)

// Options configures a Notifier. The zero value works.
type Options struct {
	Logger *slog.Logger
	Client *http.Client
	// QueueLen caps the alerts waiting per endpoint; older ones are dropped
	// past it (default 1000).
	QueueLen int
	// Timeout bounds one POST (default 10s).
	Timeout time.Duration
	// OpenFor is how long a breaker stays open before a probe (default 5s).
	OpenFor time.Duration
}

// Notifier POSTs alerts to webhooks, one goroutine per endpoint.
type Notifier struct {
	opts     Options
	log      *slog.Logger
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	closed   bool
	channels map[string]*endpoint
}

type endpoint struct {
	url     string
	queue   chan core.Alert
	breaker *gobreaker.CircuitBreaker[struct{}]
}

// New starts a notifier; Close stops it.
func New(opts Options) *Notifier {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Client == nil {
		opts.Client = &http.Client{}
	}
	if opts.QueueLen <= 0 {
		opts.QueueLen = 1000
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.OpenFor <= 0 {
		opts.OpenFor = 5 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Notifier{opts: opts, log: opts.Logger.With("component", "webhook"), ctx: ctx, cancel: cancel, channels: map[string]*endpoint{}}
}

// Notify queues an alert for its webhook; it never blocks.
func (n *Notifier) Notify(a core.Alert) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed || a.WebhookURL == "" {
		return
	}
	ep := n.channels[a.WebhookURL]
	if ep == nil {
		ep = &endpoint{url: a.WebhookURL, queue: make(chan core.Alert, n.opts.QueueLen)}
		ep.breaker = newBreaker[struct{}](n.log, a.WebhookURL, 3, n.opts.OpenFor)
		n.channels[a.WebhookURL] = ep
		n.wg.Go(func() { n.run(ep) })
	}
	select {
	case ep.queue <- a:
	default:
		n.log.Warn("webhook queue full, alert dropped", "url", a.WebhookURL, "alert", a.Alert, "status", a.Status)
	}
}

// run delivers one endpoint's alerts in order, retrying each until it is
// delivered or the notifier closes. The breaker turns an outage into one
// probe per OpenFor instead of a request per retry.
func (n *Notifier) run(ep *endpoint) {
	for {
		var a core.Alert
		select {
		case <-n.ctx.Done():
			return
		case a = <-ep.queue:
		}
		backoff := 100 * time.Millisecond
		for {
			_, err := ep.breaker.Execute(func() (struct{}, error) { return struct{}{}, n.post(ep.url, a) })
			if err == nil {
				break
			}
			n.log.Debug("webhook delivery failed", "url", ep.url, "err", err)
			select {
			case <-n.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, n.opts.OpenFor)
		}
	}
}

// payload is the webhook body of SPEC §3.
type payload struct {
	Status string `json:"status"`
	Alert  string `json:"alert"`
	Topic  string `json:"topic"`
	Group  string `json:"group"`
	Value  int64  `json:"value"`
	Max    int64  `json:"max"`
	At     string `json:"at"`
	// TransactionID: the transaction of a transaction_check_limit alert.
	TransactionID string `json:"transactionId,omitempty"`
}

func (n *Notifier) post(url string, a core.Alert) error {
	body, err := json.Marshal(payload{Status: a.Status, Alert: a.Alert, Topic: a.Topic, Group: a.Group,
		Value: a.Value, Max: a.Max, At: a.At.UTC().Format("2006-01-02T15:04:05.000Z07:00"), TransactionID: a.TransactionID})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "tidemq-webhook/1")
	resp, err := n.opts.Client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("webhook %s answered %s", url, resp.Status)
	}
	return nil
}

// Close stops delivery (queued alerts are dropped) and waits for the
// endpoint goroutines. It is idempotent.
func (n *Notifier) Close() error {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
	return nil
}
