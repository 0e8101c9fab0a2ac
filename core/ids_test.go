package core_test

import (
	"errors"
	"testing"

	"github.com/tidemq/tidemq/core"
)

// Ids restarted from the highest surviving one after a reboot, so a
// deleted subscription's id went to the next one created, and a receipt
// handle from before the restart could ack a message of the new group.
func TestRegressionDeletedSubscriptionIDIsNotReused(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("orders", 1)
	e.subscribe("orders", "keep", core.SubscriptionConfig{})
	e.subscribe("orders", "gone", core.SubscriptionConfig{})
	e.send("orders", "m0")
	stale := e.pull("orders", "gone", core.PullRequest{})
	if len(stale) != 1 {
		t.Fatalf("pulled %d", len(stale))
	}
	if err := e.b.DeleteSubscription(t.Context(), "orders", "gone"); err != nil {
		t.Fatal(err)
	}
	e.restart()
	e.subscribe("orders", "fresh", core.SubscriptionConfig{})
	_, failed, err := e.b.Ack(t.Context(), "orders", "fresh", []string{stale[0].ReceiptHandle})
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || !errors.Is(failed[0].Err, core.ErrReceiptInvalid) {
		t.Fatalf("a deleted subscription's handle on a new one: failed %v, want receipt_invalid", failed)
	}
	if got := e.pull("orders", "fresh", core.PullRequest{}); len(got) != 1 {
		t.Fatalf("the new group got %d messages, want m0", len(got))
	}
}
