package main

import (
	"fmt"
	"strings"

	"github.com/tidemq/tidemq/loadtest"
)

// The transactional phases of the target suite (SPEC §9): every request's
// messages sent as the half messages of one transaction, then committed,
// beside plain sends of the same shape measured right before on a broker
// of their own. They run only when -phases names them:
//
//	go run ./loadtest/cmd/tidemq-load -suite targets -inprocess -phases '^(tx-)?(single-p16|batch100-p16)-1KiB$'
//
// A transaction writes twice what a send does (the half messages, then the
// commit that puts them in their queues), each write synced: about half
// the plain rate is what the design costs; the target asks for 40%.

const txPrefix = "tx-"

// txSingleProducers is the single-send curve's point that gets a
// transactional twin.
const txSingleProducers = 16

func txPhase(plain string) string { return txPrefix + plain }

func isTxPhase(name string) bool { return strings.HasPrefix(name, txPrefix) }

// txSends is sends with every request one transaction.
func txSends(count, batch, size int) loadtest.Scenario {
	sc := sends(count, batch, size)
	sc.Producers.Transactional = true
	return sc
}

// txTargets compares each transactional phase that ran with its plain
// twin of the same round (msg/s committed over msg/s sent).
func txTargets(add addFunc, sfx, label string) {
	for _, t := range []struct{ what, plain string }{
		{"half message + commit, 100 msgs/transaction, 16 producers, 1 KiB, against plain batch sends", "batch100-p16-1KiB"},
		{fmt.Sprintf("half message + commit, 1 msg/transaction, %d producers, 1 KiB, against plain single sends", txSingleProducers),
			fmt.Sprintf("single-p%d-1KiB", txSingleProducers)},
	} {
		plain, tx := t.plain+sfx, txPhase(t.plain)+sfx
		add(t.what+label, "≥ 40%", []string{tx, plain}, func(r float64) bool { return r >= 0.4 }, func(g map[string]phase) (float64, string, string, bool) {
			m, b := g[tx], g[plain]
			return m.MsgsPerSec / b.MsgsPerSec, fmt.Sprintf("%s msg/s committed", thousands(m.MsgsPerSec)),
				fmt.Sprintf("%s msg/s (%s)", thousands(b.MsgsPerSec), b.Name), len(m.Errors) > 0
		})
	}
}
