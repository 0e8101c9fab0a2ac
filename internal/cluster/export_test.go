package cluster

import "context"

// AbandonOnNewLeader exposes the forwarder's watch to the external tests.
func (c *Cluster) AbandonOnNewLeader(ctx context.Context, leader string) (context.Context, func()) {
	return c.abandonOnNewLeader(ctx, leader)
}

// ErrLeaderChanged is the cause of a forwarded request's abandonment.
var ErrLeaderChanged = errLeaderChanged
