package core

// Proposer makes a batch the appender built durable.
type Proposer interface {
	// Propose makes batch durable (the local proposer: committed, synced
	// unless Options.NoSync) and returns once it is; alone is Batch.Commit's
	// hint. The caller closes the batch afterwards, success or not. The
	// broker calls it from one goroutine at a time, in commit order.
	Propose(batch Batch, alone bool) error
}

// localProposer commits to the broker's own store.
type localProposer struct{ sync bool }

func (p localProposer) Propose(batch Batch, alone bool) error { return batch.Commit(p.sync, alone) }

// LocalProposer returns the proposer a broker without Options.Proposer
// uses: it commits each batch to the broker's store, synced when sync is
// set. A proposer that observes commits wraps it.
func LocalProposer(sync bool) Proposer { return localProposer{sync: sync} }

// proposer is the one the appender commits through.
func (o *Options) proposer() Proposer {
	if o.Proposer != nil {
		return o.Proposer
	}
	return localProposer{sync: !o.NoSync}
}

// epochProposer is the one the start's epoch is committed through: the
// local one always syncs it, whatever NoSync says, since a lost epoch would
// let a receipt handle from before a crash match a lease after it.
func (o *Options) epochProposer() Proposer {
	if o.Proposer != nil {
		return o.Proposer
	}
	return localProposer{sync: true}
}
