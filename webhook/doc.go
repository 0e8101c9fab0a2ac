// Package webhook delivers the broker's outbound HTTP calls: alert
// notifications to subscription webhooks. Each endpoint has its own queue
// and a circuit breaker (sony/gobreaker), so a dead endpoint is probed, not
// hammered, and what it missed is delivered once it is back.
package webhook
