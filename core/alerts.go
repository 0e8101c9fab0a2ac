package core

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// AlertConfig holds a subscription's thresholds: an alert fires when the
// value goes above its maximum and resolves when it is back at or below.
type AlertConfig struct {
	MaxLag     *int64 `json:"maxLag,omitempty"`
	MaxDLQ     *int64 `json:"maxDlq,omitempty"`
	WebhookURL string `json:"webhookUrl,omitempty"`
}

// Alert is one change of an alert's state (SPEC §3).
type Alert struct {
	Status string // firing | resolved
	Alert  string // lag | dlq
	Topic  string
	Group  string
	// Mirror names the mirror of a mirror's lag alert (its Group is
	// "mirror.<name>", its Topic the local topic).
	Mirror     string
	Value      int64
	Max        int64
	At         time.Time
	WebhookURL string
	// TransactionID names the transaction of a transaction alert.
	TransactionID string
}

// Notifier delivers alert changes (the binary POSTs them to webhooks).
// Notify must not block: it queues.
type Notifier interface {
	Notify(Alert)
}

// alertLoop checks every subscription's thresholds and reports changes
// once each: firing when a value goes above its maximum, resolved when it
// comes back.
func (b *Broker) alertLoop() {
	tick := time.NewTicker(b.opts.AlertInterval)
	defer tick.Stop()
	firing := map[[2]string]map[string]bool{}
	for {
		select {
		case <-b.closing:
			return
		case <-tick.C:
		}
		seen := map[[2]string]bool{}
		for _, t := range b.ListTopics() {
			subs, _ := b.eachSubscription(t.Name, (*subscription).stats)
			for _, s := range subs {
				cfg := s.Config.Alerts
				if cfg == nil {
					continue
				}
				id := [2]string{t.Name, s.Group}
				seen[id] = true
				if firing[id] == nil {
					firing[id] = map[string]bool{}
				}
				b.checkAlert(firing[id], "lag", s, cfg.MaxLag, s.Lag, cfg.WebhookURL)
				b.checkAlert(firing[id], "dlq", s, cfg.MaxDLQ, s.DLQ, cfg.WebhookURL)
			}
		}
		for _, m := range b.ListMirrors() {
			if m.Alerts == nil {
				continue
			}
			id := [2]string{"", m.Name} // no topic name is empty: no clash with a subscription
			seen[id] = true
			if firing[id] == nil {
				firing[id] = map[string]bool{}
			}
			s := SubscriptionInfo{Topic: m.Topic, Group: "mirror." + m.Name}
			b.checkAlertOf(firing[id], "lag", s, m.Name, m.Alerts.MaxLag, m.Lag, m.Alerts.WebhookURL)
		}
		for id := range firing {
			if !seen[id] {
				delete(firing, id)
			}
		}
	}
}

func (b *Broker) checkAlert(state map[string]bool, kind string, s SubscriptionInfo, maxValue *int64, value int64, webhook string) {
	b.checkAlertOf(state, kind, s, "", maxValue, value, webhook)
}

// checkAlertOf is checkAlert for a subscription's alert, or a mirror's
// (mirror named).
func (b *Broker) checkAlertOf(state map[string]bool, kind string, s SubscriptionInfo, mirror string, maxValue *int64, value int64, webhook string) {
	if maxValue == nil {
		if state[kind] {
			delete(state, kind)
		}
		return
	}
	above := value > *maxValue
	if above == state[kind] {
		return
	}
	state[kind] = above
	status := "resolved"
	if above {
		status = "firing"
	}
	a := Alert{Status: status, Alert: kind, Topic: s.Topic, Group: s.Group, Mirror: mirror, Value: value, Max: *maxValue,
		At: b.now().UTC(), WebhookURL: webhook}
	if above {
		b.log.Warn("alert firing", "alert", kind, "topic", s.Topic, "group", s.Group, "value", value, "max", *maxValue)
	} else {
		b.log.Info("alert resolved", "alert", kind, "topic", s.Topic, "group", s.Group, "value", value, "max", *maxValue)
	}
	b.tel.alerts.Add(context.Background(), 1, metric.WithAttributes(
		attribute.String("alert", kind), attribute.String("status", status),
		attribute.String("topic", s.Topic), attribute.String("group", s.Group)))
	if b.opts.Notifier != nil && webhook != "" {
		b.opts.Notifier.Notify(a)
	}
}
