package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"
)

// ClientOptions configures a Client. The zero value works.
type ClientOptions struct {
	// HTTPClient does the requests; nil means a client of its own with
	// keep-alive connections sized for a busy consumer. Its Timeout, if
	// any, must exceed the long-poll wait of a Consumer (20 s by default).
	HTTPClient *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>".
	Token string
	// UserAgent is sent as User-Agent (default "tidemq-go-sdk").
	UserAgent string
	// Logger receives the Producer's and Consumer's warnings (default
	// slog.Default()).
	Logger *slog.Logger
	// Compression asks the server to gzip its replies (Accept-Encoding:
	// gzip) when HTTPClient is nil. It is off by default, as in the SQS and
	// RocketMQ clients: on a LAN, gzipping a pull of 1 KiB messages costs
	// the broker ~16% more CPU per message, and the client as much again
	// to inflate, to save bandwidth that is rarely short there. Turn it on
	// across slow links.
	Compression bool
}

// Client talks to one tidemq server. It is safe for concurrent use. Each
// method does one HTTP request, without retries (a Producer retries, a
// Consumer keeps pulling); errors the server answered with are *APIError,
// and errors.Is classifies every failure as ErrUnavailable (worth sending
// again later) or ErrRejected (a 4xx), or neither (a 500, a bad reply).
// Close it when done with it.
type Client struct {
	base   *url.URL
	http   *http.Client
	token  string
	ua     string
	log    *slog.Logger
	closed atomic.Bool
}

// NewClient returns a client of the server at baseURL (for example
// "http://127.0.0.1:8080").
func NewClient(baseURL string, opts ClientOptions) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil {
		return nil, fmt.Errorf("tidemq: base URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("tidemq: base URL %q: want http(s)://host[:port]", baseURL)
	}
	c := &Client{base: u, http: opts.HTTPClient, token: opts.Token, ua: opts.UserAgent, log: opts.Logger}
	if c.http == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		tr.DisableCompression = !opts.Compression
		c.http = &http.Client{Transport: tr}
	}
	if c.ua == "" {
		c.ua = "tidemq-go-sdk"
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	return c, nil
}

// Close closes the client's idle keep-alive connections, whose goroutines
// would otherwise live until the server closes them, and makes every later
// call fail at once with ErrClosed (as do the Producers and Consumers using
// the client). Calls in flight, long polls included, go on until they end
// (cancel their ctx to end them sooner); their connections are closed as
// they finish. With ClientOptions.HTTPClient given, Close closes that
// client's idle connections too. Close Producers and stop Consumers first:
// their last sends and acks are calls too. Close is idempotent and returns
// nil.
func (c *Client) Close() error {
	c.closed.Store(true)
	c.http.CloseIdleConnections()
	return nil
}

// BaseURL is the server's URL as given to NewClient.
func (c *Client) BaseURL() string { return c.base.String() }

// request is one API call.
type request struct {
	method string
	path   []string // escaped one by one
	query  url.Values
	header http.Header
	in     any // JSON body, or nil
}

var traceContext = propagation.TraceContext{}

// do sends r and decodes a 2xx reply into out (when non-nil). It returns the
// status. Errors: *APIError for a non-2xx reply; otherwise a transport or
// decoding error (wrapping ctx.Err() when ctx ended).
func (c *Client) do(ctx context.Context, r request, out any) (int, error) {
	if c.closed.Load() {
		return 0, fmt.Errorf("tidemq: %s /%s: %w", r.method, strings.Join(r.path, "/"), ErrClosed)
	}
	// A call that ends after Close leaves no idle connection behind (this
	// runs after the reply's body is closed).
	defer func() {
		if c.closed.Load() {
			c.http.CloseIdleConnections()
		}
	}()
	u := *c.base
	var p strings.Builder
	p.WriteString(strings.TrimRight(u.Path, "/"))
	for _, seg := range r.path {
		p.WriteByte('/')
		p.WriteString(url.PathEscape(seg))
	}
	u.RawPath = p.String()
	u.Path, _ = url.PathUnescape(u.RawPath)
	if len(r.query) > 0 {
		u.RawQuery = r.query.Encode()
	}
	var body io.Reader
	if r.in != nil {
		b, err := json.Marshal(r.in)
		if err != nil {
			return 0, fmt.Errorf("tidemq: encoding %s %s: %w", r.method, u.Path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), body)
	if err != nil {
		return 0, fmt.Errorf("tidemq: %s %s: %w", r.method, u.Path, err)
	}
	for k, v := range r.header {
		req.Header[k] = v
	}
	if r.in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.ua)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	// Any request joins the caller's trace (SPEC §2).
	traceContext.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, &transportError{op: r.method + " " + u.Path, err: err}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return resp.StatusCode, &transportError{op: r.method + " " + u.Path + ": reading reply", err: err}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, problem(resp, data)
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		decode := json.Unmarshal
		if _, ok := out.(*PullResult); ok {
			decode = func(data []byte, out any) error { return decodePullResult(data, out.(*PullResult)) }
		}
		if err := decode(data, out); err != nil {
			// A reply cut short by a dying server; sending again is safe
			// where the caller made it so (dedup keys).
			return resp.StatusCode, &transportError{op: r.method + " " + u.Path + ": decoding reply", err: err}
		}
	}
	return resp.StatusCode, nil
}

// problem decodes an error reply. A reply that is not a problem (a proxy's
// HTML page) still gives an *APIError with the status and a bit of the body.
func problem(resp *http.Response, data []byte) *APIError {
	e := &APIError{}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/problem+json" && mt != "application/json" || json.Unmarshal(data, e) != nil {
		e = &APIError{Detail: strings.TrimSpace(string(data[:min(len(data), 512)]))}
	}
	e.Status = resp.StatusCode
	if e.Title == "" {
		e.Title = http.StatusText(resp.StatusCode)
	}
	if v := resp.Header.Get("Retry-After"); v != "" {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
			e.RetryAfter = time.Duration(n) * time.Second
		} else if t, err := http.ParseTime(v); err == nil {
			e.RetryAfter = max(time.Until(t), 0)
		}
	}
	return e
}

// transportError is a request that got no usable reply: the connection
// failed, the attempt timed out, or the reply was cut short.
type transportError struct {
	op  string
	err error
}

func (e *transportError) Error() string { return "tidemq: " + e.op + ": " + e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }

// Is classifies the failure as ErrUnavailable unless the caller cancelled
// it.
func (e *transportError) Is(target error) bool {
	return target == ErrUnavailable && !errors.Is(e.err, context.Canceled)
}

// temporary reports whether err, from a request made under ctx, may go away
// if the request is sent again: transport failures (including a per-attempt
// timeout) and 429/502/503/504/507. It is false once ctx has ended.
func temporary(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Temporary()
	}
	var te *transportError
	return errors.As(err, &te)
}

// ---------------------------------------------------------------- health

// Ready returns nil when the server is up, its store open and accepting
// writes (GET /readyz); else an error (ErrNotReady while it starts or stops).
func (c *Client) Ready(ctx context.Context) error {
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"readyz"}}, nil)
	return err
}

// ---------------------------------------------------------------- topics

// PutTopic creates the topic (created is true) or, when it exists, returns
// it, growing its queues to cfg.Queues. Asking for fewer queues than it has
// is ErrQueueCountDecrease; a bad name is ErrInvalidName.
func (c *Client) PutTopic(ctx context.Context, topic string, cfg TopicConfig) (t Topic, created bool, err error) {
	status, err := c.do(ctx, request{method: http.MethodPut, path: []string{"v1", "topics", topic}, in: cfg}, &t)
	return t, status == http.StatusCreated, err
}

// GetTopic returns the topic with its statistics (ErrTopicNotFound if none).
func (c *Client) GetTopic(ctx context.Context, topic string) (Topic, error) {
	var t Topic
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "topics", topic}}, &t)
	return t, err
}

// ListTopics returns every topic.
func (c *Client) ListTopics(ctx context.Context) ([]Topic, error) {
	var l TopicList
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "topics"}}, &l)
	return l.Topics, err
}

// DeleteTopic deletes the topic with its messages and subscriptions.
func (c *Client) DeleteTopic(ctx context.Context, topic string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: []string{"v1", "topics", topic}}, nil)
	return err
}

// -------------------------------------------------------------- messages

// Send sends one message, once: no retries and no dedup key of its own (a
// Producer does both). producerGroup, if not empty, is sent as
// X-Producer-Group; ctx's trace, if any, as traceparent.
func (c *Client) Send(ctx context.Context, topic, producerGroup string, m SendMessage) (SendResult, error) {
	var res SendResult
	_, err := c.do(ctx, request{method: http.MethodPost, path: []string{"v1", "topics", topic, "messages"},
		header: producerHeader(producerGroup), in: m}, &res)
	return res, err
}

// SendBatch sends up to 1000 messages in one atomic request, once (see
// Send). One bad message fails the batch with an *APIError whose Entry is
// its index.
func (c *Client) SendBatch(ctx context.Context, topic, producerGroup string, msgs []SendMessage) ([]SendResult, error) {
	var res BatchResult
	_, err := c.do(ctx, request{method: http.MethodPost, path: []string{"v1", "topics", topic, "messages:batch"},
		header: producerHeader(producerGroup), in: SendBatch{Messages: msgs}}, &res)
	if err == nil && len(res.Results) != len(msgs) {
		err = fmt.Errorf("tidemq: batch of %d messages got %d results", len(msgs), len(res.Results))
	}
	return res.Results, err
}

func producerHeader(group string) http.Header {
	if group == "" {
		return nil
	}
	return http.Header{"X-Producer-Group": {group}}
}

// GetMessage returns a stored message and, for every subscription of the
// topic, its state and delivery history (ErrMessageNotFound if none).
func (c *Client) GetMessage(ctx context.Context, topic, messageID string) (MessageStatus, error) {
	var s MessageStatus
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "topics", topic, "messages", messageID}}, &s)
	return s, err
}

// MessageQuery selects stored messages; the filters given are combined.
// QueryMessages needs at least one of Key, Tag, From/To or QueueID;
// Messages without any lists the whole topic.
type MessageQuery struct {
	Key string
	Tag string
	// From and To bound the store time (From inclusive, To exclusive).
	From, To time.Time
	// QueueID and Offset: messages of one queue from an offset on.
	QueueID *int
	Offset  *int64
	// Limit is the page size (1–1000, default 100).
	Limit int
	// Cursor is the Next of the previous page.
	Cursor string
}

func (q MessageQuery) values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("key", q.Key)
	set("tag", q.Tag)
	if !q.From.IsZero() {
		v.Set("from", q.From.UTC().Format(time.RFC3339Nano))
	}
	if !q.To.IsZero() {
		v.Set("to", q.To.UTC().Format(time.RFC3339Nano))
	}
	if q.QueueID != nil {
		v.Set("queueId", strconv.Itoa(*q.QueueID))
	}
	if q.Offset != nil {
		v.Set("offset", strconv.FormatInt(*q.Offset, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	set("cursor", q.Cursor)
	return v
}

// QueryMessages returns one page of stored messages matching q.
func (c *Client) QueryMessages(ctx context.Context, topic string, q MessageQuery) (MessagePage, error) {
	var p MessagePage
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "topics", topic, "messages"}, query: q.values()}, &p)
	return p, err
}

// errStuckCursor stops an iteration whose server answers a page with the
// cursor it was asked for: following it would loop forever.
var errStuckCursor = errors.New("tidemq: the server returned the same page cursor again")

// Messages iterates over every message matching q (q.Cursor is where it
// starts), fetching page after page. It stops at the first error, which it
// yields. With no filter (no Key, Tag, From, To, QueueID nor Cursor) it
// lists the whole topic: queue after queue (the queues the topic has when
// the iteration starts), each in offset order from q.Offset (default 0).
func (c *Client) Messages(ctx context.Context, topic string, q MessageQuery) iter.Seq2[StoredMessage, error] {
	if q.Key == "" && q.Tag == "" && q.From.IsZero() && q.To.IsZero() && q.QueueID == nil && q.Cursor == "" {
		return c.allMessages(ctx, topic, q)
	}
	return c.queryMessages(ctx, topic, q)
}

// allMessages is Messages over every queue of the topic.
func (c *Client) allMessages(ctx context.Context, topic string, q MessageQuery) iter.Seq2[StoredMessage, error] {
	return func(yield func(StoredMessage, error) bool) {
		t, err := c.GetTopic(ctx, topic)
		if err != nil {
			yield(StoredMessage{}, err)
			return
		}
		from := int64(0)
		if q.Offset != nil {
			from = *q.Offset
		}
		for id := range t.Queues {
			qq := q
			qq.QueueID, qq.Offset = &id, &from
			for m, err := range c.queryMessages(ctx, topic, qq) {
				if !yield(m, err) || err != nil {
					return
				}
			}
		}
	}
}

func (c *Client) queryMessages(ctx context.Context, topic string, q MessageQuery) iter.Seq2[StoredMessage, error] {
	return func(yield func(StoredMessage, error) bool) {
		for {
			page, err := c.QueryMessages(ctx, topic, q)
			if err != nil {
				yield(StoredMessage{}, err)
				return
			}
			for _, m := range page.Messages {
				if !yield(m, nil) {
					return
				}
			}
			if page.Next == nil || *page.Next == "" {
				return
			}
			if *page.Next == q.Cursor {
				yield(StoredMessage{}, errStuckCursor)
				return
			}
			q.Cursor = *page.Next
		}
	}
}

// --------------------------------------------------------- subscriptions

// PutSubscription creates the subscription (created is true) or sets the
// configuration of the existing one. A bad filter is ErrInvalidFilter.
func (c *Client) PutSubscription(ctx context.Context, topic, group string, cfg SubscriptionConfig) (s Subscription, created bool, err error) {
	status, err := c.do(ctx, request{method: http.MethodPut, path: []string{"v1", "topics", topic, "subscriptions", group}, in: cfg}, &s)
	return s, status == http.StatusCreated, err
}

// GetSubscription returns the subscription with its statistics
// (ErrSubscriptionNotFound if none).
func (c *Client) GetSubscription(ctx context.Context, topic, group string) (Subscription, error) {
	var s Subscription
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "topics", topic, "subscriptions", group}}, &s)
	return s, err
}

// ListSubscriptions returns the topic's subscriptions.
func (c *Client) ListSubscriptions(ctx context.Context, topic string) ([]Subscription, error) {
	var l SubscriptionList
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "topics", topic, "subscriptions"}}, &l)
	return l.Subscriptions, err
}

// DeleteSubscription deletes the subscription with its positions, leases,
// retries and DLQ.
func (c *Client) DeleteSubscription(ctx context.Context, topic, group string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: []string{"v1", "topics", topic, "subscriptions", group}}, nil)
	return err
}

// Seek moves the subscription to a position (or, with DryRun, counts).
func (c *Client) Seek(ctx context.Context, topic, group string, req SeekRequest) (SeekResult, error) {
	var r SeekResult
	_, err := c.do(ctx, c.subReq(topic, group, "seek", req), &r)
	return r, err
}

func (c *Client) subReq(topic, group, op string, in any) request {
	return request{method: http.MethodPost, path: []string{"v1", "topics", topic, "subscriptions", group, op}, in: in}
}

// ----------------------------------------------------------- consumption

// Pull leases up to req.MaxMessages messages, waiting up to req.WaitSeconds
// for the first (a long poll). It returns no messages and no error when the
// wait ends empty. Ending ctx abandons the poll: the server gives back what
// it leased for it.
func (c *Client) Pull(ctx context.Context, topic, group string, req PullRequest) ([]PulledMessage, error) {
	var r PullResult
	_, err := c.do(ctx, c.subReq(topic, group, "pull", req), &r)
	return r.Messages, err
}

// Ack settles messages as processed.
func (c *Client) Ack(ctx context.Context, topic, group string, req AckRequest) (AckResult, error) {
	var r AckResult
	_, err := c.do(ctx, c.subReq(topic, group, "ack", req), &r)
	return r, err
}

// Nack settles messages as failed; they are delivered again later.
func (c *Client) Nack(ctx context.Context, topic, group string, req NackRequest) (NackResult, error) {
	var r NackResult
	_, err := c.do(ctx, c.subReq(topic, group, "nack", req), &r)
	return r, err
}

// Extend keeps messages leased for req.InvisibleSeconds from now.
func (c *Client) Extend(ctx context.Context, topic, group string, req ExtendRequest) (ExtendResult, error) {
	var r ExtendResult
	_, err := c.do(ctx, c.subReq(topic, group, "extend", req), &r)
	return r, err
}

// DeadLetter moves messages to the subscription's DLQ at once.
func (c *Client) DeadLetter(ctx context.Context, topic, group string, req DeadLetterRequest) (DeadLetterResult, error) {
	var r DeadLetterResult
	_, err := c.do(ctx, c.subReq(topic, group, "deadletter", req), &r)
	return r, err
}

// ------------------------------------------------------------------- dlq

// PageOptions picks a page of a listing.
type PageOptions struct {
	// Limit is the page size (1–1000, default 100).
	Limit int
	// Cursor is the Next of the previous page.
	Cursor string
}

// ListDeadLetters returns one page of the subscription's DLQ, in the order
// the messages died.
func (c *Client) ListDeadLetters(ctx context.Context, topic, group string, page PageOptions) (DeadMessagePage, error) {
	v := url.Values{}
	if page.Limit > 0 {
		v.Set("limit", strconv.Itoa(page.Limit))
	}
	if page.Cursor != "" {
		v.Set("cursor", page.Cursor)
	}
	var p DeadMessagePage
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "topics", topic, "subscriptions", group, "dlq"}, query: v}, &p)
	return p, err
}

// DeadLetters iterates over the whole DLQ (from page.Cursor on), page.Limit
// messages per request. It stops at the first error, which it yields.
func (c *Client) DeadLetters(ctx context.Context, topic, group string, page PageOptions) iter.Seq2[DeadMessage, error] {
	return func(yield func(DeadMessage, error) bool) {
		for {
			p, err := c.ListDeadLetters(ctx, topic, group, page)
			if err != nil {
				yield(DeadMessage{}, err)
				return
			}
			for _, m := range p.Messages {
				if !yield(m, nil) {
					return
				}
			}
			if p.Next == nil || *p.Next == "" {
				return
			}
			if *p.Next == page.Cursor {
				yield(DeadMessage{}, errStuckCursor)
				return
			}
			page.Cursor = *p.Next
		}
	}
}

// Redrive puts dead messages back for delivery with fresh retries.
func (c *Client) Redrive(ctx context.Context, topic, group string, req RedriveRequest) (RedriveResult, error) {
	var r RedriveResult
	_, err := c.do(ctx, c.subReq(topic, group, "dlq:redrive", req), &r)
	return r, err
}
