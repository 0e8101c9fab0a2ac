package main

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary be the cost-polls phases' poll holder, as
// the tidemq-load binary is when the suite re-runs itself.
func TestMain(m *testing.M) {
	if child, err := pollHolderChild(); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, "poll holder:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
