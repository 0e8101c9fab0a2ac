// Package sdk is the Go client of tidemq, the HTTP+JSON message queue.
//
// It speaks only the public API (openapi.yaml) and imports nothing of the
// server. Three types do the work:
//
//   - Client: one method per API operation — topics, subscriptions, seek,
//     DLQ listing and redrive, message query and status, and the raw
//     consumption calls (Pull, Ack, Nack, Extend, DeadLetter). One request
//     each, no retries. Messages with no filter lists a whole topic. Close
//     closes its idle connections.
//   - Producer: Send, SendBatch and SendAsync (batched by size and linger
//     time) for one topic. Temporary failures (network, 429, 502, 503, 504,
//     507) are retried with backoff under a dedup key the producer makes up
//     when the message has none, so a retry never stores a duplicate, for
//     up to RetryTimeout (a call returns within it plus one
//     AttemptTimeout); a circuit breaker makes calls fail fast
//     (ErrCircuitOpen) while the broker is down.
//   - Consumer: Run(ctx, handler) long-polls a subscription and runs up to
//     Concurrency handlers: nil acks (batched), an error nacks (RetryAfter
//     picks the delay, DeadLetter sends to the DLQ at once). Leases of
//     running handlers are extended; messages of one sharding key are
//     handled in order on orderly subscriptions; cancelling ctx stops it
//     gracefully.
//
// Transactional messages (half messages): Producer.SendInTransaction sends
// messages that nobody gets until a local transaction (a database
// change) has committed, and drops them if it fails; a producer that dies
// in between is asked by the broker's check-back, which
// TransactionCheckHandler answers from the producer's own records. Client
// has the single calls (PrepareTransaction, CommitTransaction,
// RollbackTransaction, ListTransactions).
//
// Errors the server answers with are *APIError values; errors.Is matches
// them against one sentinel per error code (ErrTopicNotFound,
// ErrInvalidName, …). errors.Is also sorts every failure into a class:
// ErrUnavailable (no reply, a timeout, 429/502/503/504/507, a Producer's
// retries run out or its breaker open: the broker may take it later) or
// ErrRejected (any other 4xx: sending it again does not help).
//
// Replies are not gzipped unless ClientOptions.Compression asks: on a LAN,
// compressing and inflating pull replies costs both sides more CPU than the
// bandwidth it saves is worth.
//
// Traces: every request carries the W3C traceparent of its ctx, so a send
// joins the caller's trace; the ctx a Handler gets continues the message's
// trace (and holds a "tidemq.process" span when a TracerProvider is set).
//
// Delivery is at least once: a handler may see a message again (after a
// lease ran out, a crash, a lost ack), so handlers must be idempotent.
package sdk
