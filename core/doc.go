// Package core is the broker: topics split into ordered queues, subscriptions
// with server-side leases, group commit, and long polling. It knows neither
// HTTP nor Pebble: storage comes in through the Store interface, which
// pebblestore implements, and transport lives in gateway.
//
// The write path is one a replica can follow. Requests are decided where
// the broker serves (reading clocks, disk space and memory as needed) into
// one Batch per group commit, which holds every durable effect, counters
// included; a Proposer makes it durable (the single node commits it with
// one fsync; a cluster hands its encoded bytes to Raft and every replica
// applies them). A send that finds the appender idle and nothing queued
// commits itself, under the same lock, to spare a lone request two
// goroutine handoffs.
//
// Memory follows durability: offsets become visible, and a subscription's
// deliveries are settled, only once the batch that records it is durable
// (effects.go). Everything that must outlive a restart or a change of
// leader is rebuilt from the store by New; serving state (leases, long-poll
// waiters, the loops) is not stored and starts afresh with a new Broker.
//
// Consumer leases (who holds which message until when) are kept in memory:
// they are ephemeral by nature, and losing them in a crash only means the
// messages are delivered again, which the at-least-once contract allows.
// What a lease's end decides (a failed attempt, an orderly suspension) is
// durable, as are acked watermarks and out-of-order acks.
//
// An orderly pull that takes a sharding key's first outstanding message
// takes the key's next consecutive ones too, up to its maxMessages, and a
// failure of one of them revokes the leases of the key's later ones in
// that pull, which go out again after it (cursor.go, keyState). Revoking
// a lease writes nothing: the attempts, suspensions and acks that are
// stored say all a restart needs to keep each key's order.
package core
