// Package loadtest drives a tidemq broker over plain HTTP+JSON and measures
// what its users get: messages per second, latency distributions (HDR
// histograms: p50, p90, p99, p99.9, max) of sends, pulls, acks and of each
// message from send to delivery, and errors counted by problem code.
//
// A [Scenario] describes the load: producers (single or batch sends, message
// size, closed loop at a fixed concurrency or open loop at a fixed rate),
// consumers (pull size, concurrency, ack or not), and how long (a duration or
// a message count). [Scenario.Run] runs it and returns a [Report], which
// marshals to JSON and renders as markdown.
//
// The package imports nothing of the server: it speaks the wire format of
// openapi.yaml with net/http. The command loadtest/cmd/tidemq-load wraps it
// with flags, an in-process broker, the raw-Pebble and no-op-HTTP
// baselines of the target suite, the backlog suite (the real broker as
// a separate process, holding a large backlog), the cluster suite and the
// mirror suite (two regions' brokers, a mirror between them).
//
// End-to-end latency: every message carries two properties, [PropRun] (the
// run's id) and [PropSentAt] (Unix nanoseconds when its send request was
// built, or in open loop when it was scheduled). A consumer that pulls a
// first delivery of this run's messages records now − sentAt, so producer
// and consumer must share a clock (the same machine). Messages of other
// runs that a consumer meets are acked and counted as stale.
//
// Backlogs: a run given the RunID of an earlier one counts that run's
// messages as its own, so one producers-only run can fill a backlog (for a
// subscription made first with [Admin.PutSubscription] from "earliest")
// and a consumers-only run drain it. [Scenario.OnInterval] hands every
// progress interval's numbers to the caller, for time series.
//
// Open loop: sends are scheduled at fixed intervals from the start and a
// send's latency counts from its scheduled time, not from when a producer
// got to it, so a broker that falls behind shows its queueing in the
// percentiles instead of hiding it (no coordinated omission).
package loadtest
