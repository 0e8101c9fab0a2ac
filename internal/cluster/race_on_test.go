//go:build race

package cluster_test

// raceEnabled: the race detector is on.
const raceEnabled = true
