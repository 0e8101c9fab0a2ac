//go:build !linux

package main

import (
	"os/exec"
	"time"
)

// setPdeathsig does nothing off Linux: the suite's own clean-up kills the
// broker on every path out of it, but not when the load tester is killed.
func setPdeathsig(*exec.Cmd) {}

// pageFaultCost is not measured off Linux.
func pageFaultCost() time.Duration { return 0 }
