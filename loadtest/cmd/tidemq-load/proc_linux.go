package main

import (
	"os/exec"
	"syscall"
	"time"
)

// setPdeathsig has the kernel SIGKILL the broker when the thread that
// started it dies, so a load tester killed with SIGKILL (or a test binary
// that times out) leaves no broker behind. Go does not end the threads
// of goroutines that are not locked to them, so in practice this fires
// only when the whole process is gone.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// pageFaultCost is what first touching a page of fresh anonymous memory
// costs here, timed over pages of a 16 MiB mapping (0 when it cannot be
// mapped): a fresh broker pays it for every page its heap, memtables and
// caches grow into, and on a VM it can be 20× bare metal.
func pageFaultCost() time.Duration {
	const size, page = 16 << 20, 4096
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return 0
	}
	defer syscall.Munmap(mem)
	start := time.Now()
	for i := 0; i < size; i += page {
		mem[i] = 1
	}
	return time.Since(start) / (size / page)
}
