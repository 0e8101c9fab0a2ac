package core

import (
	"context"
	"errors"
	"fmt"
	"syscall"
)

type requestKind uint8

const (
	reqAppend requestKind = iota
	// reqAdmin writes topic or subscription definitions. It is applied in a
	// batch of its own so that it never shares a commit with appends it
	// might invalidate (a topic delete racing a send).
	reqAdmin
	// reqAcks persists consumer positions.
	reqAcks
)

// request is one command for the appender. Everything apply needs is in it:
// the times were stamped by whoever made it, so applying is deterministic.
type request struct {
	kind  requestKind
	topic *topic
	msgs  []*Message
	admin func(Batch)
	acks  []ackWrite
	done  chan error
}

// ackWrite is the durable effect of acks on one subscription queue.
type ackWrite struct {
	subID, queueID uint32
	watermark      uint64
	setWatermark   bool
	put, del       []uint64
}

// submit hands r to the appender and waits until it is durable.
func (b *Broker) submit(ctx context.Context, r *request) error {
	r.done = make(chan error, 1)
	if b.closed.Load() {
		return ErrClosed
	}
	select {
	case b.requests <- r:
	case <-b.closing:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	// Once queued, the request is applied whatever the caller does; waiting
	// for it keeps the reply truthful.
	return <-r.done
}

// appendLoop is the only writer: it drains waiting requests into one batch,
// commits it with one fsync, then makes the new offsets visible and answers.
// While a commit runs, new requests pile up and form the next batch: group
// commit with no linger timer, so a lone request pays one fsync and no wait.
func (b *Broker) appendLoop() {
	var pending []*request
	var carry *request
	for {
		var first *request
		if carry != nil {
			first, carry = carry, nil
		} else {
			select {
			case first = <-b.requests:
			case <-b.closing:
				b.drainOnClose()
				return
			}
		}
		pending = append(pending[:0], first)
		size := first.size()
		if first.kind != reqAdmin {
		collect:
			for size < b.opts.MaxCommitBytes {
				select {
				case r := <-b.requests:
					if r.kind == reqAdmin {
						carry = r
						break collect
					}
					pending = append(pending, r)
					size += r.size()
				default:
					break collect
				}
			}
		}
		b.commit(pending)
		clear(pending)
	}
}

// drainOnClose answers whatever is still queued: a request that made it
// into the channel before Close is applied, so its sender gets the truth.
func (b *Broker) drainOnClose() {
	for {
		var batch []*request
	drain:
		for {
			select {
			case r := <-b.requests:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		if len(batch) == 0 {
			return
		}
		for _, r := range batch {
			b.commit([]*request{r})
		}
	}
}

func (r *request) size() int {
	n := 64
	for _, m := range r.msgs {
		n += len(m.Body) + 128
	}
	return n
}

func (b *Broker) commit(reqs []*request) {
	batch := b.store.NewBatch()
	defer batch.Close()
	// One store time per batch, never going backwards, so the time index
	// and storedAt stay monotonic per queue even if the wall clock steps back.
	nowMs := max(b.now().UnixMilli(), b.lastMs)
	seqBefore := b.nextSeq
	var touched []*queue
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		switch r.kind {
		case reqAdmin:
			r.admin(batch)
		case reqAcks:
			for _, w := range r.acks {
				if w.setWatermark {
					batch.PutAckWatermark(w.subID, w.queueID, w.watermark)
				}
				for _, o := range w.put {
					batch.PutAck(w.subID, w.queueID, o)
				}
				for _, o := range w.del {
					batch.DeleteAck(w.subID, w.queueID, o)
				}
			}
		case reqAppend:
			if r.topic.deleted.Load() {
				errs[i] = fmt.Errorf("%w: %s", ErrTopicNotFound, r.topic.rec.Name)
				continue
			}
			b.mu.RLock()
			queues := r.topic.queues
			b.mu.RUnlock()
			for _, m := range r.msgs {
				q := queues[m.QueueID]
				m.Offset = q.pendingNext
				m.Seq = b.nextSeq
				m.StoredAtMs = nowMs
				q.pendingNext++
				q.pendingBytes += int64(len(m.Body))
				b.nextSeq++
				batch.Append(m)
				if !q.touched {
					q.touched = true
					touched = append(touched, q)
				}
			}
		}
	}
	for _, q := range touched {
		batch.PutQueueMeta(q.topicID, q.id, q.pendingNext, q.pendingBytes)
	}
	err := batch.Commit(!b.opts.NoSync)
	if err != nil {
		b.log.Error("commit failed", "err", err, "requests", len(reqs))
		b.nextSeq = seqBefore
		for _, q := range touched {
			q.pendingNext, q.pendingBytes = q.next.Load(), q.bytes.Load()
			q.touched = false
		}
		for _, r := range reqs {
			r.done <- classifyStoreError(err)
		}
		return
	}
	b.lastMs = nowMs
	for _, q := range touched {
		q.next.Store(q.pendingNext)
		q.bytes.Store(q.pendingBytes)
		q.touched = false
	}
	woken := map[*topic]bool{}
	for i, r := range reqs {
		if r.kind == reqAppend && errs[i] == nil && !woken[r.topic] {
			woken[r.topic] = true
			b.wakeSubscriptions(r.topic)
		}
		r.done <- errs[i]
	}
}

// classifyStoreError turns a full disk into ErrInsufficientStorage, which
// clients see as 507 and may retry once space returns.
func classifyStoreError(err error) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: %v", ErrInsufficientStorage, err)
	}
	return err
}
