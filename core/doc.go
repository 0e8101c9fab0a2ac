// Package core is the broker: topics split into ordered queues, subscriptions
// with server-side leases, group commit, and long polling. It knows neither
// HTTP nor Pebble: storage comes in through the Store interface, which
// pebblestore implements, and transport lives in gateway.
//
// Every durable change of state is a command that the appender goroutine
// applies to one Batch and commits with a single fsync for many requests
// (group commit). A send that finds the appender idle and nothing queued
// commits itself, under the same lock, to spare a lone request two
// goroutine handoffs. Offsets become visible to pulls only after the
// commit that made them durable has returned.
//
// Consumer leases (who holds which message until when) are kept in memory:
// they are ephemeral by nature, and losing them in a crash only means the
// messages are delivered again, which the at-least-once contract allows.
// Acked watermarks and out-of-order acks are durable.
package core
