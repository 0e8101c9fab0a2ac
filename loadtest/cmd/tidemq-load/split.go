package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// With -broker-process the target suite runs each broker phase's broker
// as a child process (the binary of cmd/tidemq) instead of in this one, so
// that the CPU of the two sides is told apart exactly: the child's
// utime+stime from /proc is the server's, this process's the client's
// (with the stand-in OTLP collector the child exports its spans to). A
// CPU profile's side labels split the in-process broker's CPU too, but
// by sampling, and leave the garbage collector's share to neither side.

// childBrokers is the binary the suite's child brokers run, in work (a
// temp dir the suite removes), built from ./cmd/tidemq unless bin is
// given.
func childBrokers(ctx context.Context, baseDir, bin string) (path, work string, err error) {
	work, err = os.MkdirTemp(baseDir, "tidemq-load-brokers-")
	if err != nil {
		return "", "", err
	}
	if bin != "" {
		if st, err := os.Stat(bin); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			return "", work, fmt.Errorf("-broker-bin %s is not an executable file (%v)", bin, err)
		}
		return bin, work, nil
	}
	path, err = buildBroker(ctx, work)
	return path, work, err
}

// withChildBroker calls f with the URL of a fresh child broker on a data
// dir of its own under c.brokerWork, and c.brokerCPU reading its CPU time
// while f runs; the broker is stopped (SIGTERM) and its data removed
// after.
func (c *suite) withChildBroker(ctx context.Context, name string, f func(url string) error) (err error) {
	dir, err := os.MkdirTemp(c.brokerWork, "data-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	logPath := filepath.Join(c.brokerWork, "broker.log")
	p, _, err := startBrokerProc(ctx, c.childBin, dir, logPath, time.Minute)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	defer func() {
		if _, terr := p.terminate(30 * time.Second); terr != nil {
			err = errors.Join(err, fmt.Errorf("%s: stopping the broker: %w", name, terr))
		}
	}()
	c.brokerCPU = p.cpu
	defer func() { c.brokerCPU = nil }()
	return f(p.URL)
}

// splitCPU sets the server's and the client's CPU per message, and makes
// CPUPerMsg and Cores the two together, when the broker was a child
// process.
func (p *phase) splitCPU(use usage, msgs int64, elapsed time.Duration) {
	if !use.child || msgs <= 0 {
		return
	}
	p.ServerCPUPerMsg = use.server / time.Duration(msgs)
	p.ClientCPUPerMsg = use.cpu / time.Duration(msgs)
	p.CPUPerMsg = p.ServerCPUPerMsg + p.ClientCPUPerMsg
	for _, n := range use.nodes {
		p.NodeCPUPerMsg = append(p.NodeCPUPerMsg, n/time.Duration(msgs))
	}
	if elapsed > 0 {
		p.Cores = (use.cpu + use.server).Seconds() / elapsed.Seconds()
		for _, f := range use.nodeFaults {
			p.NodeFaultsPerSec = append(p.NodeFaultsPerSec, float64(f)/elapsed.Seconds())
		}
	}
}

// writeCPUSplit renders the server and client CPU of the phases that had
// a child broker.
func writeCPUSplit(b *strings.Builder, phases []phase) {
	header := false
	for _, p := range phases {
		if p.ServerCPUPerMsg == 0 && p.ClientCPUPerMsg == 0 {
			continue
		}
		if !header {
			b.WriteString("\n### CPU per message, server and client\n\n" +
				"The broker ran as a child process (-broker-process): server is its CPU time (user+system, from /proc), client this process's " +
				"(the load generator and the stand-in OTLP collector the broker exports spans to), per message while measuring; " +
				"CPU/msg above is the two together.\n\n" +
				"| phase | round | client | msg/s | server CPU/msg | client CPU/msg | total |\n|---|---:|---|---:|---:|---:|---:|\n")
			header = true
		}
		fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s |\n", p.Name, p.Round, p.Client, thousands(p.MsgsPerSec),
			dur(p.ServerCPUPerMsg), dur(p.ClientCPUPerMsg), dur(p.ServerCPUPerMsg+p.ClientCPUPerMsg))
	}
}
