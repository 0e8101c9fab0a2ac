package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// peakRSS is a process's peak resident set (VmHWM), in bytes.
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// TestFloodOfLargeBatchesKeepsRSSBounded: 48 connections posting 15 MB
// batches as fast as they are answered, for 3 s, leave the broker's peak
// RSS under 512 MiB with the default body budget: the batches past it are
// refused before they are read. Without the budget the same flood takes
// the broker past 800 MiB.
func TestFloodOfLargeBatchesKeepsRSSBounded(t *testing.T) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("GOGC or GOMEMLIMIT is set: the broker would not run with its own collector settings")
	}
	if _, err := peakRSS(os.Getpid()); err != nil {
		t.Skipf("no /proc status to read RSS from: %v", err)
	}
	p := startTidemq(t, t.TempDir(), "--fsync", "never")

	var b bytes.Buffer
	b.WriteString(`{"messages":[`)
	for i := range 4 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"body":"%s"}`, bytes.Repeat([]byte{'a' + byte(i)}, 3_750_000))
	}
	b.WriteString(`]}`)
	payload := b.Bytes()

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	const conns = 48
	tr := &http.Transport{MaxIdleConnsPerHost: conns}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var created, refused atomic.Int64
	var other sync.Map // status or error → count, for the failure message
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequest("POST", p.base+"/v1/topics/flood/messages:batch", bytes.NewReader(payload))
				req.Header.Set("Content-Type", "application/json")
				resp, err := hc.Do(req)
				if err != nil {
					other.Store(err.Error(), true)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusCreated:
					created.Add(1)
				case http.StatusTooManyRequests:
					refused.Add(1)
				default:
					other.Store(resp.Status, true)
				}
			}
		})
	}
	wg.Wait()
	peak, err := peakRSS(p.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d batches stored, %d refused; peak RSS %d MiB", created.Load(), refused.Load(), peak>>20)
	other.Range(func(k, _ any) bool { t.Errorf("a batch got %v", k); return true })
	if created.Load() == 0 || refused.Load() == 0 {
		t.Errorf("%d batches stored, %d refused: want some of each", created.Load(), refused.Load())
	}
	if peak > 512<<20 {
		t.Errorf("peak RSS %d MiB, want at most 512 MiB", peak>>20)
	}
}
