package loadtest

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"time"
)

// Scenario is one load test: who sends, who consumes, for how long. The zero
// value of every field but URL and one of Producers.Count or Consumers.Count
// is usable; [Scenario.Validate] reports what is wrong with the rest.
type Scenario struct {
	// URL is the broker's base URL, e.g. http://127.0.0.1:8080.
	URL string `json:"url"`
	// URLs, when not empty, are the base URLs producers and consumers are
	// spread over: producer i and consumer i send to URLs[i % len(URLs)]
	// (the nodes of a cluster behind a round-robin balancer). Setup and
	// cleanup go to URL.
	URLs []string `json:"urls,omitempty"`
	// Token is sent as "Authorization: Bearer <Token>" when not empty. It
	// needs publish and subscribe on the topic, and admin to create the
	// topic and subscription (or use SkipSetup).
	Token string `json:"-"`
	// Client does the requests; nil means NewClient's, without gzip (like
	// the SDK's default). Pass one client to several runs to reuse its
	// connections.
	Client *http.Client `json:"-"`
	// ClientKind is how requests are written and replies read: ClientLean
	// (the default) or ClientPlain. The HTTP client is the same for both.
	ClientKind string `json:"client,omitempty"`

	// Topic is the topic to use. Empty means a fresh topic
	// "loadtest-<run id>" that Run creates and deletes at the end; a named
	// topic is created if missing (PUT) and kept.
	Topic string `json:"topic,omitempty"`
	// Queues is the queue count of a topic Run creates (0: the broker's
	// default, 8).
	Queues int `json:"queues,omitempty"`
	// Group is the consumer group (default "loadtest"). Its subscription is
	// created with startFrom "latest"; messages of earlier runs still
	// waiting for it are acked and counted as stale.
	Group string `json:"group,omitempty"`
	// SkipSetup sends no topic or subscription requests: they must exist
	// already, or the broker must auto-create them.
	SkipSetup bool `json:"skipSetup,omitempty"`
	// RunID is the run's id, stamped on every message sent ([PropRun]);
	// empty means a fresh random one. Consumers count only messages of
	// their own run as deliveries, so a consumers-only run given the RunID
	// of earlier producers-only runs consumes their messages as its own:
	// that is how a backlog is filled by one run and drained by another.
	RunID string `json:"runId,omitempty"`

	Producers Producers `json:"producers"`
	Consumers Consumers `json:"consumers"`

	// Duration is how long producers send. With producers, at least one of
	// Duration and Messages must be set; when both are, the first reached
	// ends the run. Without producers it is how long consumers pull.
	Duration time.Duration `json:"duration,omitempty"`
	// Messages is how many messages producers send in all (or, without
	// producers, how many first deliveries consumers wait for).
	Messages int64 `json:"messages,omitempty"`
	// DrainTimeout is how long consumers keep pulling after producers stop,
	// until every message sent has been delivered once (default 10s).
	DrainTimeout time.Duration `json:"drainTimeout,omitempty"`
	// RequestTimeout bounds each request, on top of a pull's wait (default
	// 30s).
	RequestTimeout time.Duration `json:"requestTimeout,omitempty"`

	// Progress, when not nil, gets a one-line summary of the last interval
	// every ProgressInterval (default 1s) while the run goes.
	Progress         io.Writer     `json:"-"`
	ProgressInterval time.Duration `json:"-"`
	// OnInterval, when not nil, is called with the numbers of the last
	// interval every ProgressInterval, and once more for the last, shorter
	// interval when the run ends; always from one goroutine, never after
	// Run returned. It must not block for long: the next interval waits.
	OnInterval func(Interval) `json:"-"`
}

// Producers describe the sending side.
type Producers struct {
	// Count is the number of concurrent producers: each has at most one
	// request in flight. 0 means no producers.
	Count int `json:"count"`
	// Batch is the messages per request: 1 (or 0) sends each message alone
	// (POST …/messages), more sends them together (POST …/messages:batch,
	// at most 1000).
	Batch int `json:"batch,omitempty"`
	// MessageBytes is the body size of each message (default 1024): random
	// lowercase letters, so the JSON needs no escaping (with ClientPlain,
	// random bytes, base64 on the wire).
	MessageBytes int `json:"messageBytes,omitempty"`
	// Rate, when above 0, makes the test open loop: messages per second in
	// all, in requests of Batch messages scheduled at even intervals and
	// handed to whichever producer is free. 0 is closed loop: every
	// producer sends its next request as soon as the previous is answered.
	Rate float64 `json:"rate,omitempty"`
	// Transactional makes every request one transaction (SPEC §9): its
	// messages go as half messages ("transaction":{"checkAfterSeconds":
	// 60}, a delay no run's commit comes near), then the producer commits
	// them (POST …/transactions/{id}:commit). The messages count as sent,
	// and the send's latency ends, when the commit is answered; a failed
	// commit counts as the error "commit <code>".
	Transactional bool `json:"transactional,omitempty"`
}

// Consumers describe the consuming side.
type Consumers struct {
	// Count is the number of concurrent consumers, each pulling in a loop.
	// 0 means no consumers.
	Count int `json:"count"`
	// MaxMessages is the pull size (default 32, at most 1000).
	MaxMessages int `json:"maxMessages,omitempty"`
	// WaitSeconds is the long-poll wait of each pull (default 1, at most
	// 30). Negative means 0: answer at once.
	WaitSeconds int `json:"waitSeconds,omitempty"`
	// InvisibleSeconds is the lease of pulled messages (default 30).
	InvisibleSeconds int `json:"invisibleSeconds,omitempty"`
	// NoAck leaves pulled messages unacked (they come back after their
	// lease). By default each pull's messages are acked in one request.
	NoAck bool `json:"noAck,omitempty"`
	// StartFrom is the startFrom of the subscription Run creates:
	// "latest" (the default: only what is sent from now on) or "earliest"
	// (every message still retained).
	StartFrom string `json:"startFrom,omitempty"`
}

// The kinds of client a run can be (Scenario.ClientKind).
const (
	// ClientLean writes requests by hand (letter bodies, no escaping),
	// discards send replies unread and reads pull replies with fastjson:
	// as little load-generator CPU as the API allows.
	ClientLean = "lean"
	// ClientPlain is what most users' code does: encoding/json encodes
	// every request and decodes every reply into structs of the API's
	// fields, and each message is fresh random bytes sent as base64
	// ("bodyEncoding": "base64"), decoded again when pulled.
	ClientPlain = "plain"
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,126}$`)

// Validate reports every problem of the scenario, joined.
func (s Scenario) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("loadtest: "+format, args...)) }
	if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("URL %q is not an http(s) URL", s.URL)
	}
	for _, v := range s.URLs {
		if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("URLs: %q is not an http(s) URL", v)
		}
	}
	if s.Topic != "" && !nameRE.MatchString(s.Topic) {
		bad("Topic %q is not a valid name", s.Topic)
	}
	if s.Group != "" && !nameRE.MatchString(s.Group) {
		bad("Group %q is not a valid name", s.Group)
	}
	if s.RunID != "" && (!nameRE.MatchString(s.RunID) || (s.Topic == "" && !nameRE.MatchString("loadtest-"+s.RunID))) {
		bad("RunID %q is not a valid name (nor, without Topic, is loadtest-<RunID>)", s.RunID)
	}
	if sf := s.Consumers.StartFrom; sf != "" && sf != "latest" && sf != "earliest" {
		bad("Consumers.StartFrom %q is not latest or earliest", sf)
	}
	if k := s.ClientKind; k != "" && k != ClientLean && k != ClientPlain {
		bad("ClientKind %q is not %s or %s", k, ClientLean, ClientPlain)
	}
	if s.Queues < 0 || s.Queues > 1024 {
		bad("Queues %d is not between 0 and 1024", s.Queues)
	}
	p, c := s.Producers, s.Consumers
	if p.Count < 0 || c.Count < 0 {
		bad("Producers.Count and Consumers.Count cannot be negative")
	}
	if p.Count == 0 && c.Count == 0 {
		bad("no producers and no consumers")
	}
	if p.Batch < 0 || p.Batch > 1000 {
		bad("Producers.Batch %d is not between 1 and 1000", p.Batch)
	}
	if p.MessageBytes < 0 {
		bad("Producers.MessageBytes %d is negative", p.MessageBytes)
	}
	if p.Rate < 0 {
		bad("Producers.Rate %g is negative", p.Rate)
	}
	if c.MaxMessages < 0 || c.MaxMessages > 1000 {
		bad("Consumers.MaxMessages %d is not between 1 and 1000", c.MaxMessages)
	}
	if c.WaitSeconds > 30 {
		bad("Consumers.WaitSeconds %d is above 30", c.WaitSeconds)
	}
	if c.InvisibleSeconds < 0 || c.InvisibleSeconds > 43200 {
		bad("Consumers.InvisibleSeconds %d is not between 1 and 43200", c.InvisibleSeconds)
	}
	if s.Duration < 0 || s.Messages < 0 || s.DrainTimeout < 0 || s.RequestTimeout < 0 || s.ProgressInterval < 0 {
		bad("durations and counts cannot be negative")
	}
	if s.Duration == 0 && s.Messages == 0 {
		bad("neither Duration nor Messages is set: the run would never end")
	}
	return errors.Join(errs...)
}

// withDefaults fills the zero fields with their defaults.
func (s Scenario) withDefaults() Scenario {
	if s.Group == "" {
		s.Group = "loadtest"
	}
	if s.ClientKind == "" {
		s.ClientKind = ClientLean
	}
	if s.Producers.Batch == 0 {
		s.Producers.Batch = 1
	}
	if s.Producers.MessageBytes == 0 {
		s.Producers.MessageBytes = 1024
	}
	if s.Consumers.MaxMessages == 0 {
		s.Consumers.MaxMessages = 32
	}
	switch {
	case s.Consumers.WaitSeconds == 0:
		s.Consumers.WaitSeconds = 1
	case s.Consumers.WaitSeconds < 0:
		s.Consumers.WaitSeconds = 0
	}
	if s.Consumers.StartFrom == "" {
		s.Consumers.StartFrom = "latest"
	}
	if s.Consumers.InvisibleSeconds == 0 {
		s.Consumers.InvisibleSeconds = 30
	}
	if s.DrainTimeout == 0 {
		s.DrainTimeout = 10 * time.Second
	}
	if s.RequestTimeout == 0 {
		s.RequestTimeout = 30 * time.Second
	}
	if s.ProgressInterval == 0 {
		s.ProgressInterval = time.Second
	}
	if s.Client == nil {
		s.Client = NewClient(s.Producers.Count+2*s.Consumers.Count+4, false)
	}
	return s
}

// NewClient returns a clone of http.DefaultTransport that keeps up to conns
// idle connections to the broker and asks for gzip replies only when gzip
// is set (the SDK's ClientOptions.Compression; off by default).
func NewClient(conns int, gzip bool) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableCompression = !gzip
	tr.MaxIdleConns = 2 * conns
	tr.MaxIdleConnsPerHost = conns
	return &http.Client{Transport: tr}
}
