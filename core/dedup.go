package core

import (
	"slices"
	"time"
)

// DedupWindow is how long a send's dedup key is remembered by default
// (SPEC §2; Options.DedupWindow).
const DedupWindow = 5 * time.Minute

// MaxDedupKeyLen caps a dedup key.
const MaxDedupKeyLen = 128

type dedupID struct {
	topicID uint32
	key     string
}

// The dedup memory is owned by the appender: a dedup key is checked and
// recorded in apply, so two concurrent sends with one key store one message.

func (b *Broker) restoreDedup(recs []*DedupRecord, nowMs int64) {
	slices.SortFunc(recs, func(x, y *DedupRecord) int { return int(x.StoredMs - y.StoredMs) })
	for _, r := range recs {
		b.dedup[dedupID{r.TopicID, r.Key}] = r
		b.dedupOrder = append(b.dedupOrder, r)
	}
}

// expireDedup forgets keys older than the window.
func (b *Broker) expireDedup(batch Batch, nowMs int64) {
	cut := nowMs - b.opts.DedupWindow.Milliseconds()
	n := 0
	for n < len(b.dedupOrder) && b.dedupOrder[n].StoredMs < cut {
		r := b.dedupOrder[n]
		id := dedupID{r.TopicID, r.Key}
		if b.dedup[id] == r {
			delete(b.dedup, id)
			batch.DeleteDedup(r.TopicID, r.Key)
		}
		n++
	}
	if n > 0 {
		b.dedupOrder = append(b.dedupOrder[:0], b.dedupOrder[n:]...)
	}
}

// rollbackDedup forgets the keys of a batch that failed to commit.
func (b *Broker) rollbackDedup() {
	for _, r := range b.dedupAdded {
		id := dedupID{r.TopicID, r.Key}
		if b.dedup[id] == r {
			delete(b.dedup, id)
		}
	}
	b.dedupAdded = b.dedupAdded[:0]
}
