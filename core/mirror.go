package core

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Mirrors (SPEC §8): a topic of another region copied into a local topic.
// The broker keeps their definitions and, per mirror and source queue,
// which source offsets are stored here (the skip record), both durable
// through Batch; the copying itself is serving state, done by a runner
// outside core (package mirror) that reports its status back.

// Mirror states (MirrorInfo.State).
const (
	MirrorRunning = "running"
	MirrorPaused  = "paused"
	MirrorFailing = "failing"
)

// Properties every copy carries (SPEC §8).
const (
	PropMirrorSourceRegion    = "mirror.sourceRegion"
	PropMirrorSourceMessageID = "mirror.sourceMessageId"
	PropMirrorPath            = "mirror.path"
)

// MaxMirrorTokenLen caps a source token; MaxMirrorURLLen a source URL.
const (
	MaxMirrorTokenLen = 4096
	MaxMirrorURLLen   = 2048
)

// MirrorSource is where a mirror copies from: a topic of another tidemq,
// reached over its public HTTP API with Token as bearer.
type MirrorSource struct {
	URL   string `json:"url"`
	Topic string `json:"topic"`
	// Token is never shown back (MirrorInfo leaves it out).
	Token string `json:"token,omitempty"`
}

// MirrorConfig is what a client may set on PUT /v1/mirrors/{name}.
type MirrorConfig struct {
	Source    MirrorSource
	Topic     string
	Filter    string // "" means "*"
	StartFrom string // "" means earliest
	Paused    bool
	Alerts    *AlertConfig
}

// MirrorRecord is a mirror's durable definition.
type MirrorRecord struct {
	Name        string       `json:"name"`
	Source      MirrorSource `json:"source"`
	Topic       string       `json:"topic"`
	Filter      string       `json:"filter"`
	StartFrom   string       `json:"startFrom"`
	Paused      bool         `json:"paused,omitempty"`
	Alerts      *AlertConfig `json:"alerts,omitempty"`
	CreatedAtMs int64        `json:"createdAtMs"`
}

// MirrorProgress is a mirror's durable skip record for one source queue:
// every source offset below Watermark is stored here, and so are the ones
// in Stored (ascending, all above it). An orderly source subscription
// hands a queue's offsets out of order across keys, so the watermark
// advances only as the gaps below Stored fill, like a subscription's acks.
// Copied and LastCopiedMs count what this queue's copies added.
type MirrorProgress struct {
	QueueID      uint32
	Watermark    uint64
	Stored       []uint64
	Copied       uint64
	LastCopiedMs int64
}

// MirrorCopy is one message pulled from a mirror's source: Msg is the copy
// to store, or nil when it is not to be stored (its path already holds this
// region) and only its source offset is to be recorded.
type MirrorCopy struct {
	Msg         *Message
	SourceQueue uint32
	SourceOff   uint64
}

// MirrorStatus is what the runner reports about a running mirror.
type MirrorStatus struct {
	// Failing says the last attempt failed; LastError says how.
	Failing   bool
	LastError string
	// Lag is the source subscription's lag (-1: not known yet).
	Lag int64
}

// MirrorInfo is a mirror's definition and state, as GET answers it.
type MirrorInfo struct {
	Name         string
	Source       MirrorSource // Token left empty
	Topic        string
	Filter       string
	StartFrom    string
	Alerts       *AlertConfig
	CreatedAt    time.Time
	State        string
	Lag          int64
	Copied       uint64
	LastCopiedAt time.Time // zero: nothing copied yet
	LastError    string
}

// mirror is a mirror's memory. rec, queues and status are read and
// replaced under mu; pending is the appender's (under commitMu): the skip
// state the batch being built has reached, installed into queues once the
// batch is durable.
type mirror struct {
	name string

	mu     sync.Mutex
	rec    *MirrorRecord
	queues map[uint32]*MirrorProgress
	status MirrorStatus

	pending map[uint32]*MirrorProgress
}

// paused reports whether the mirror's definition says paused.
func (m *mirror) paused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rec.Paused
}

// has reports whether the offset is recorded in p.
func (p *MirrorProgress) has(off uint64) bool {
	if off < p.Watermark {
		return true
	}
	_, found := slices.BinarySearch(p.Stored, off)
	return found
}

// mark records off and advances the watermark over the gaps it fills.
func (p *MirrorProgress) mark(off uint64) {
	i, found := slices.BinarySearch(p.Stored, off)
	if found || off < p.Watermark {
		return
	}
	p.Stored = slices.Insert(p.Stored, i, off)
	n := 0
	for n < len(p.Stored) && p.Stored[n] == p.Watermark {
		p.Watermark++
		n++
	}
	p.Stored = append(p.Stored[:0], p.Stored[n:]...)
}

// raise moves the watermark up to w (the source's acked offset: nothing
// below it is delivered again), dropping the offsets it passes.
func (p *MirrorProgress) raise(w uint64) bool {
	if w <= p.Watermark {
		return false
	}
	p.Watermark = w
	n := sort.Search(len(p.Stored), func(i int) bool { return p.Stored[i] >= w })
	p.Stored = append(p.Stored[:0], p.Stored[n:]...)
	for len(p.Stored) > 0 && p.Stored[0] == p.Watermark {
		p.Watermark++
		p.Stored = p.Stored[1:]
	}
	return true
}

func (p *MirrorProgress) clone() *MirrorProgress {
	c := *p
	c.Stored = slices.Clone(p.Stored)
	return &c
}

// pendingQueue is the skip state of a source queue as the batch being
// built sees it (appender-owned).
func (m *mirror) pendingQueue(q uint32) *MirrorProgress {
	if p := m.pending[q]; p != nil {
		return p
	}
	if m.pending == nil {
		m.pending = map[uint32]*MirrorProgress{}
	}
	m.mu.Lock()
	p := m.queues[q]
	m.mu.Unlock()
	if p == nil {
		p = &MirrorProgress{QueueID: q}
	} else {
		p = p.clone()
	}
	m.pending[q] = p
	return p
}

// ValidateMirrorConfig checks a mirror's configuration and fills in defaults.
func ValidateMirrorConfig(cfg MirrorConfig) (MirrorConfig, error) {
	u, err := url.Parse(cfg.Source.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(cfg.Source.URL) > MaxMirrorURLLen {
		return cfg, invalid("/source/url", "must be an http or https URL of at most %d bytes", MaxMirrorURLLen)
	}
	if err := ValidateName("topic", cfg.Source.Topic); err != nil {
		return cfg, err
	}
	if len(cfg.Source.Token) > MaxMirrorTokenLen || !utf8.ValidString(cfg.Source.Token) || strings.ContainsAny(cfg.Source.Token, "\r\n") {
		return cfg, invalid("/source/token", "must be at most %d bytes on one line", MaxMirrorTokenLen)
	}
	if err := ValidateName("topic", cfg.Topic); err != nil {
		return cfg, err
	}
	if cfg.Filter == "" {
		cfg.Filter = "*"
	}
	if _, err := ParseFilter(cfg.Filter); err != nil {
		return cfg, err
	}
	switch cfg.StartFrom {
	case "":
		cfg.StartFrom = "earliest"
	case "earliest", "latest":
	default:
		if _, err := time.Parse(time.RFC3339Nano, cfg.StartFrom); err != nil {
			return cfg, invalid("/startFrom", "must be earliest, latest or an RFC 3339 time")
		}
	}
	if a := cfg.Alerts; a != nil {
		if a.MaxLag != nil && *a.MaxLag < 0 {
			return cfg, invalid("/alerts/maxLag", "must not be negative")
		}
		if a.MaxDLQ != nil {
			return cfg, invalid("/alerts/maxDlq", "a mirror has no dead-letter queue; only maxLag applies")
		}
		if a.WebhookURL != "" && !strings.HasPrefix(a.WebhookURL, "http://") && !strings.HasPrefix(a.WebhookURL, "https://") {
			return cfg, invalid("/alerts/webhookUrl", "must be an http or https URL")
		}
	}
	return cfg, nil
}

// PutMirror creates or updates a mirror and reports whether it created it.
// The local topic must exist unless auto-create is on. Changing the
// source (URL or topic) starts the skip record afresh: offsets of another
// source name other messages.
func (b *Broker) PutMirror(ctx context.Context, name string, cfg MirrorConfig) (MirrorInfo, bool, error) {
	if err := ValidateName("mirror", name); err != nil {
		return MirrorInfo{}, false, err
	}
	cfg, err := ValidateMirrorConfig(cfg)
	if err != nil {
		return MirrorInfo{}, false, err
	}
	if _, err := b.topicForSend(ctx, cfg.Topic); err != nil {
		return MirrorInfo{}, false, err
	}
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	b.mu.RLock()
	existing := b.mirrors[name]
	b.mu.RUnlock()
	rec := &MirrorRecord{Name: name, Source: cfg.Source, Topic: cfg.Topic, Filter: cfg.Filter, StartFrom: cfg.StartFrom,
		Paused: cfg.Paused, Alerts: cfg.Alerts, CreatedAtMs: b.now().UnixMilli()}
	reset := false
	if existing != nil {
		existing.mu.Lock()
		old := existing.rec
		existing.mu.Unlock()
		rec.CreatedAtMs = old.CreatedAtMs
		if cfg.StartFrom != old.StartFrom {
			// Where a subscription starts matters only when it is made:
			// the source subscription exists already.
			rec.StartFrom = old.StartFrom
		}
		reset = old.Source.URL != rec.Source.URL || old.Source.Topic != rec.Source.Topic
	}
	m := existing
	if m == nil || reset {
		m = &mirror{name: name, queues: map[uint32]*MirrorProgress{}, status: MirrorStatus{Lag: -1}}
		if reset {
			rec.StartFrom = cfg.StartFrom
		}
	}
	if m != existing {
		m.rec = rec // not seen by anyone before it is durable
	}
	err = b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) {
		if reset {
			batch.DeleteMirror(name)
		}
		batch.PutMirror(rec)
	}, after: func() {
		m.mu.Lock()
		m.rec = rec
		m.mu.Unlock()
		// A replaced mirror object (a new source) is no longer the
		// broker's: copies still on their way to it are refused (commit).
		b.mu.Lock()
		b.mirrors[name] = m
		b.mu.Unlock()
	}})
	if err != nil {
		return MirrorInfo{}, false, err
	}
	if existing == nil {
		b.log.Info("mirror created", "mirror", name, "source", rec.Source.URL, "source_topic", rec.Source.Topic, "topic", rec.Topic)
	}
	return b.mirrorInfo(m), existing == nil, nil
}

// GetMirror answers a mirror's definition and state.
func (b *Broker) GetMirror(name string) (MirrorInfo, error) {
	if err := ValidateName("mirror", name); err != nil {
		return MirrorInfo{}, err
	}
	m := b.mirror(name)
	if m == nil {
		return MirrorInfo{}, fmt.Errorf("%w: %s", ErrMirrorNotFound, name)
	}
	return b.mirrorInfo(m), nil
}

// ListMirrors answers every mirror, by name.
func (b *Broker) ListMirrors() []MirrorInfo {
	b.mu.RLock()
	ms := make([]*mirror, 0, len(b.mirrors))
	for _, m := range b.mirrors {
		ms = append(ms, m)
	}
	b.mu.RUnlock()
	slices.SortFunc(ms, func(x, y *mirror) int { return strings.Compare(x.name, y.name) })
	out := make([]MirrorInfo, len(ms))
	for i, m := range ms {
		out[i] = b.mirrorInfo(m)
	}
	return out
}

// MirrorDefinitions answers every mirror's record, source token included:
// for the runner, never for clients.
func (b *Broker) MirrorDefinitions() []MirrorRecord {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]MirrorRecord, 0, len(b.mirrors))
	for _, m := range b.mirrors {
		m.mu.Lock()
		out = append(out, *m.rec)
		m.mu.Unlock()
	}
	slices.SortFunc(out, func(x, y MirrorRecord) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// DeleteMirror removes a mirror, its definition and its skip record; the
// runner stops copying it.
func (b *Broker) DeleteMirror(ctx context.Context, name string) error {
	if err := ValidateName("mirror", name); err != nil {
		return err
	}
	b.adminMu.Lock()
	defer b.adminMu.Unlock()
	m := b.mirror(name)
	if m == nil {
		return fmt.Errorf("%w: %s", ErrMirrorNotFound, name)
	}
	err := b.submit(ctx, &request{kind: reqAdmin, admin: func(batch Batch) { batch.DeleteMirror(name) }, after: func() {
		b.mu.Lock()
		if b.mirrors[name] == m {
			delete(b.mirrors, name)
		}
		b.mu.Unlock()
	}})
	if err == nil {
		b.log.Info("mirror deleted", "mirror", name)
	}
	return err
}

// ReportMirror records what the runner saw of a mirror (its state, lag and
// last error); it is memory only, reported again after a restart.
func (b *Broker) ReportMirror(name string, st MirrorStatus) {
	if m := b.mirror(name); m != nil {
		m.mu.Lock()
		m.status = st
		m.mu.Unlock()
	}
}

// MirrorStored reports whether a source offset of a mirror is stored here.
func (b *Broker) MirrorStored(name string, queue uint32, offset uint64) bool {
	m := b.mirror(name)
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.queues[queue]
	return p != nil && p.has(offset)
}

// SendMirrored stores the copies of one pulled batch of a mirror, and
// records their source offsets, in one batch: a crash never leaves copies
// without their record or the reverse. A copy whose source offset is
// recorded already is not stored again (nor is one whose dedup key, the
// source message id, the dedup window still holds). Copies of a mirror
// that is paused are refused (ErrMirrorPaused). It answers how many
// copies it stored.
func (b *Broker) SendMirrored(ctx context.Context, name string, copies []MirrorCopy) (int, error) {
	m := b.mirror(name)
	if m == nil {
		return 0, fmt.Errorf("%w: %s", ErrMirrorNotFound, name)
	}
	m.mu.Lock()
	topicName := m.rec.Topic
	m.mu.Unlock()
	if len(copies) == 0 || len(copies) > MaxBatchMessages {
		return 0, invalid("/messages", "must hold 1-%d messages", MaxBatchMessages)
	}
	var msgs []*Message
	var srcs []MirrorCopy
	var skipped []MirrorCopy
	for i, c := range copies {
		if c.Msg == nil {
			skipped = append(skipped, c)
			continue
		}
		if err := ValidateMessage(c.Msg, b.opts.MaxMessageBytes); err != nil {
			return 0, &EntryError{Entry: i, Err: err}
		}
		msgs = append(msgs, c.Msg)
		srcs = append(srcs, c)
	}
	t, err := b.topicForSend(ctx, topicName)
	if err != nil {
		return 0, err
	}
	b.place(t, msgs)
	spans := b.tel.beginLinkedSends(ctx, msgs, b.now())
	req := &request{kind: reqAppend, topic: t, msgs: msgs, mirror: &mirrorWrite{m: m, srcs: srcs, skipped: skipped}}
	err = b.submit(ctx, req)
	spans.end(topicName, msgs, req.results, err)
	if err != nil {
		return 0, err
	}
	stored := 0
	var bytes int64
	for i, r := range req.results {
		if !r.Duplicate {
			stored++
			bytes += int64(len(msgs[i].Body))
		}
	}
	if stored > 0 {
		b.tel.msgsIn.Add(ctx, int64(stored), t.metricAttrs...)
		b.tel.bytesIn.Add(ctx, bytes, t.metricAttrs...)
	}
	return stored, nil
}

// RaiseMirrorWatermarks records that nothing below acked[queue] of the
// source will be delivered again (the source subscription's acked
// offsets), so the skip record need not keep gaps the source's filter
// left below it.
func (b *Broker) RaiseMirrorWatermarks(ctx context.Context, name string, acked map[uint32]uint64) error {
	m := b.mirror(name)
	if m == nil {
		return fmt.Errorf("%w: %s", ErrMirrorNotFound, name)
	}
	raise := false
	m.mu.Lock()
	for q, w := range acked {
		if p := m.queues[q]; p == nil || w > p.Watermark {
			raise = true
		}
	}
	m.mu.Unlock()
	if !raise {
		return nil
	}
	return b.submit(ctx, &request{kind: reqAppend, mirror: &mirrorWrite{m: m, raise: acked}})
}

// mirrorWrite is a mirror's share of an append request: the source
// offsets of its messages (srcs[i] for msgs[i]), those it records without
// storing a copy, and watermark raises. touched is apply's: the source
// queues whose skip record the batch rewrites.
type mirrorWrite struct {
	m       *mirror
	srcs    []MirrorCopy
	skipped []MirrorCopy
	raise   map[uint32]uint64
	touched []uint32
}

// mirrorMark records the source offset of message i of r, a copy, and
// reports false when it was recorded already: the copy is not stored
// again (appender-owned).
func (b *Broker) mirrorMark(r *request, i int) bool {
	w := r.mirror
	c := w.srcs[i]
	p := w.m.pendingQueue(c.SourceQueue)
	if p.has(c.SourceOff) {
		return false
	}
	p.mark(c.SourceOff)
	w.touch(c.SourceQueue)
	return true
}

// mirrorCopied counts a copy stored now.
func (b *Broker) mirrorCopied(r *request, i int, nowMs int64) {
	p := r.mirror.m.pending[r.mirror.srcs[i].SourceQueue]
	p.Copied++
	p.LastCopiedMs = nowMs
}

func (w *mirrorWrite) touch(q uint32) {
	if !slices.Contains(w.touched, q) {
		w.touched = append(w.touched, q)
	}
}

// applyMirror records the offsets r records without a copy, raises
// watermarks, and writes the skip records r changed.
func (b *Broker) applyMirror(batch Batch, r *request) {
	w := r.mirror
	m := w.m
	for _, c := range w.skipped {
		if p := m.pendingQueue(c.SourceQueue); !p.has(c.SourceOff) {
			p.mark(c.SourceOff)
			w.touch(c.SourceQueue)
		}
	}
	qs := make([]uint32, 0, len(w.raise))
	for q := range w.raise {
		qs = append(qs, q)
	}
	slices.Sort(qs) // the same decision is the same bytes
	for _, q := range qs {
		if m.pendingQueue(q).raise(w.raise[q]) {
			w.touch(q)
		}
	}
	slices.Sort(w.touched)
	for _, q := range w.touched {
		batch.PutMirrorProgress(m.name, *m.pending[q])
	}
	if !slices.Contains(b.mirrorsTouched, m) {
		b.mirrorsTouched = append(b.mirrorsTouched, m)
	}
}

// mirrorsCommitted installs (ok) or drops the skip state of the batch just
// committed (appender-owned).
func (b *Broker) mirrorsCommitted(ok bool) {
	for _, m := range b.mirrorsTouched {
		if ok {
			m.mu.Lock()
			for q, p := range m.pending {
				m.queues[q] = p
			}
			m.mu.Unlock()
		}
		m.pending = nil
	}
	b.mirrorsTouched = b.mirrorsTouched[:0]
}

func (b *Broker) mirror(name string) *mirror {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.mirrors[name]
}

func (b *Broker) mirrorInfo(m *mirror) MirrorInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := m.rec
	info := MirrorInfo{Name: m.name, Source: MirrorSource{URL: rec.Source.URL, Topic: rec.Source.Topic}, Topic: rec.Topic,
		Filter: rec.Filter, StartFrom: rec.StartFrom, Alerts: rec.Alerts, CreatedAt: time.UnixMilli(rec.CreatedAtMs).UTC(),
		State: MirrorRunning, Lag: max(m.status.Lag, 0), LastError: m.status.LastError}
	switch {
	case rec.Paused:
		info.State = MirrorPaused
	case m.status.Failing:
		info.State = MirrorFailing
	}
	var last int64
	for _, p := range m.queues {
		info.Copied += p.Copied
		last = max(last, p.LastCopiedMs)
	}
	if last > 0 {
		info.LastCopiedAt = time.UnixMilli(last).UTC()
	}
	return info
}

// restoreMirrors rebuilds the mirrors' memory from the store.
func (b *Broker) restoreMirrors(snap *Snapshot) {
	for _, rec := range snap.Mirrors {
		m := &mirror{name: rec.Name, rec: rec, queues: map[uint32]*MirrorProgress{}, status: MirrorStatus{Lag: -1}}
		for _, p := range snap.MirrorProgress[rec.Name] {
			m.queues[p.QueueID] = &p
		}
		b.mirrors[rec.Name] = m
	}
}
