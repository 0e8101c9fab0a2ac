package webhook_test

import (
	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/webhook"
)

// The single-node broker is one implementation of what the Pusher drives.
var _ webhook.Broker = (*core.Broker)(nil)
