// Package webhook makes the broker's outbound HTTP calls, which core never
// makes: push delivery (the Pusher POSTs the messages of subscriptions with
// a push endpoint, acking on 2xx and nacking otherwise) and alert
// notifications to webhooks (the Notifier), and transaction checks (the
// Checker asks a producer whether to commit an undecided half message).
// Each endpoint has its own
// circuit breaker (sony/gobreaker), so a dead endpoint is probed, not
// hammered: a push the breaker stops is released without counting an
// attempt, so an outage does not burn messages into the DLQ, and alerts
// wait in the endpoint's bounded queue (the oldest dropped past it) until
// it is back.
//
// The Pusher drives a Broker, the interface of the few operations it calls,
// rather than *core.Broker, so that a cluster's routing broker can stand
// behind it as behind the gateway.
package webhook
