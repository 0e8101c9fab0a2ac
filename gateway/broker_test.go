package gateway_test

import (
	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
)

// The single-node broker is one implementation of what the gateway serves.
var _ gateway.Broker = (*core.Broker)(nil)
