package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The parked polls of the cost-polls phases are held by a child process
// of this binary, not by the load generator: held here, their goroutines
// and net/http's two loops a connection (~30,000 stacks) were scanned by
// every collection of the process generating the hot-topic load, and its
// CPU a message more than doubled (docs/bench/polls-2026-12-07.md). Real
// pollers are other machines.

// The child is this binary (or the test binary, whose TestMain asks
// pollHolderChild first) started with these variables set.
const (
	pollHolderURLEnv = "TIDEMQ_LOAD_POLL_HOLDER_URL"
	pollHolderNEnv   = "TIDEMQ_LOAD_POLL_HOLDER_N"
)

// pollCounts are the holder's polls: written once each (the first write
// of its request), parked while a request waits, errors.
type pollCounts struct {
	written, parked, errs atomic.Int64
}

// pollHolderChild runs the poll holder and reports true when this
// process was started as one; it then has done its work.
func pollHolderChild() (bool, error) {
	url := os.Getenv(pollHolderURLEnv)
	if url == "" {
		return false, nil
	}
	n, err := strconv.Atoi(os.Getenv(pollHolderNEnv))
	if err != nil || n < 1 {
		return true, fmt.Errorf("%s=%q: want a count", pollHolderNEnv, os.Getenv(pollHolderNEnv))
	}
	return true, holdPolls(url, n, os.Stdin, os.Stdout)
}

// holdPolls parks n long polls (30 s, re-issued as each answers) on url,
// in waves so that the listen backlog is not flooded, and writes
// "written parked errors" to out every 100 ms until in ends.
func holdPolls(url string, n int, in io.Reader, out io.Writer) error {
	if err := raiseNoFile(uint64(n) + 4096); err != nil {
		return err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = n, n
	hc := &http.Client{Transport: tr}
	defer hc.CloseIdleConnections()
	var counts pollCounts
	var polls sync.WaitGroup
	defer polls.Wait()
	// Deferred last, so it runs first: the polls end before they are
	// waited for, however this returns.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		_, _ = io.Copy(io.Discard, in)
		stop()
	}()
	polls.Go(func() {
		const wave = 500
		for started := 0; started < n && ctx.Err() == nil; {
			for range min(wave, n-started) {
				polls.Go(func() { counts.poll(ctx, hc, url) })
				started++
			}
			for counts.written.Load() < int64(started) && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
		}
	})
	w := bufio.NewWriter(out)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		fmt.Fprintf(w, "%d %d %d\n", counts.written.Load(), counts.parked.Load(), counts.errs.Load())
		if err := w.Flush(); err != nil {
			return nil // the parent is gone
		}
	}
}

// raiseNoFile raises the soft limit of open files to at least n (the
// hard limit permitting): each parked poll holds a socket.
func raiseNoFile(n uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= n {
		return nil
	}
	if lim.Max < n {
		return fmt.Errorf("open files: %d parked polls need about %d descriptors, the hard limit is %d (ulimit -Hn)", n-4096, n, lim.Max)
	}
	lim.Cur = n
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}

// poll long-polls url until ctx ends, counting itself parked while its
// request waits for a reply.
func (pc *pollCounts) poll(ctx context.Context, hc *http.Client, url string) {
	var first sync.Once
	body := []byte(`{"maxMessages":1,"waitSeconds":30}`)
	for ctx.Err() == nil {
		tr := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) {
			first.Do(func() { pc.written.Add(1) })
			pc.parked.Add(1)
		}}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, tr), "POST", url, bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		pc.parked.Add(-1)
		if err != nil && ctx.Err() == nil {
			pc.errs.Add(1)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// pollHolder is a running holder, seen from the process that started it.
type pollHolder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	counts pollCounts    // as the holder last reported them
	done   chan struct{} // closed once it has exited and its reports are read
}

// startPollHolder starts a holder of n polls on url: this binary again,
// killed with this process.
func startPollHolder(url string, n int) (*pollHolder, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), pollHolderURLEnv+"="+url, pollHolderNEnv+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	setPdeathsig(cmd)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the poll holder: %w", err)
	}
	h := &pollHolder{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		readPollCounts(stdout, &h.counts)
		_ = cmd.Wait()
	}()
	return h, nil
}

// waitWritten returns once the holder has written n polls, or an error
// when it ended first or wait ran out.
func (h *pollHolder) waitWritten(ctx context.Context, n int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for h.counts.written.Load() < int64(n) {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d polls written after %s (%d errors)", h.counts.written.Load(), n, wait, h.counts.errs.Load())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.done:
			return fmt.Errorf("the poll holder ended with %d of %d polls written", h.counts.written.Load(), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// close ends the holder (closing its stdin ends its polls, then it) and
// waits for it.
func (h *pollHolder) close() {
	_ = h.stdin.Close()
	<-h.done
}

// readPollCounts stores each "written parked errors" line of r into pc
// until r ends.
func readPollCounts(r io.Reader, pc *pollCounts) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var w, p, e int64
		if _, err := fmt.Sscan(sc.Text(), &w, &p, &e); err == nil {
			pc.written.Store(w)
			pc.parked.Store(p)
			pc.errs.Store(e)
		}
	}
}
