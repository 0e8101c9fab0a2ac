package main

import (
	"os/exec"
	"syscall"
)

// setPdeathsig has the kernel SIGKILL the broker when the thread that
// started it dies, so a load tester killed with SIGKILL (or a test binary
// that times out) leaves no broker behind. Go does not end the threads
// of goroutines that are not locked to them, so in practice this fires
// only when the whole process is gone.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
