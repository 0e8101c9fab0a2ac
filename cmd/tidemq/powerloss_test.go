package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidemq/tidemq/internal/lazyfs"
)

// Power-loss tests: the binary's data on a lazyfs mount, which forgets at
// each PowerLoss every write not fsynced. SIGKILL alone cannot tell a
// working fsync from a missing one, since the kernel keeps what a killed
// process wrote; a kill followed by a power loss can.

// mountLazyFS mounts a power-loss file system for the test and unmounts
// it when the test ends, after the brokers it started are stopped (their
// cleanups run first); it skips the test, saying why, where FUSE mounts
// are impossible.
func mountLazyFS(t *testing.T) (*lazyfs.FS, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("mounts a FUSE file system (lazyfs); skipped with -short")
	}
	if err := lazyfs.Supported(); err != nil {
		t.Skipf("mounts a FUSE file system: %v", err)
	}
	mnt, state := t.TempDir(), t.TempDir()
	fs, err := lazyfs.Mount(mnt, state)
	if err != nil {
		t.Skipf("mounts a FUSE file system: mount refused: %v", err)
	}
	t.Cleanup(func() {
		if err := fs.Unmount(); err != nil {
			t.Errorf("lazyfs: %v", err)
		}
	})
	return fs, mnt
}

// TestCrashLoopWithPowerLoss is the crash loop with every kill followed by
// a power loss: the broker, with its defaults (fsync always, WAL syncs
// through io_uring), loses no acknowledged send, and the loop's checks of
// order and offsets hold on what the syncs kept.
func TestCrashLoopWithPowerLoss(t *testing.T) {
	fs, mnt := mountLazyFS(t)
	// The broker makes its data dir: its name, too, must be synced.
	runCrashLoop(t, filepath.Join(mnt, "data"), crashKills(t), func(t *testing.T) {
		if err := fs.PowerLoss(); err != nil {
			t.Fatal(err)
		}
	})
	st := fs.Stats()
	if st.PowerLosses == 0 || st.FileSyncs == 0 {
		t.Errorf("lazyfs saw %+v; want power losses and file syncs", st)
	}
	t.Logf("lazyfs: %d power losses, %d file syncs, %d directory syncs, %d bytes never synced dropped",
		st.PowerLosses, st.FileSyncs, st.DirSyncs, st.LostBytes)
}

// TestPowerLossLosesSendsOnlyWithoutFsync: producers send batches while
// the broker is killed and the power lost, three times; then every
// message is read back. With --fsync always (the default) every
// acknowledged send is there; with --fsync never some are not, which
// shows the first result comes from the syncs and not from a file system
// that keeps everything.
func TestPowerLossLosesSendsOnlyWithoutFsync(t *testing.T) {
	for _, mode := range []string{"always", "never"} {
		t.Run("fsync="+mode, func(t *testing.T) {
			acked, lost, st := sendThroughPowerLosses(t, mode)
			t.Logf("--fsync %s: %d of %d acknowledged messages lost; lazyfs: %d file syncs, %d directory syncs, %d bytes never synced dropped",
				mode, lost, acked, st.FileSyncs, st.DirSyncs, st.LostBytes)
			if mode == "always" && lost > 0 {
				t.Errorf("--fsync always: %d of %d acknowledged messages lost in power losses", lost, acked)
			}
			if mode == "never" && lost == 0 {
				t.Errorf("--fsync never: none of %d acknowledged messages lost in %d power losses; the test cannot tell a sync from none", acked, st.PowerLosses)
			}
		})
	}
}

// sendThroughPowerLosses creates a topic (synced: the broker's default),
// then runs three cycles of load on a broker started with --fsync mode,
// each ended by SIGKILL and a power loss, and reads everything back. It
// returns the messages acknowledged and, of them, the ones not found.
func sendThroughPowerLosses(t *testing.T, mode string) (acked, lost int, st lazyfs.Stats) {
	const (
		cycles, producers, batchSize = 3, 4, 10
		topic                        = "pl"
	)
	fs, mnt := mountLazyFS(t)
	dir := filepath.Join(mnt, "data") // the broker makes it
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	kill := func(p *process) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := p.waitExit(t, 10*time.Second); err == nil {
			t.Fatal("tidemq exited cleanly after SIGKILL?")
		}
		if err := fs.PowerLoss(); err != nil {
			t.Fatal(err)
		}
	}

	p := startTidemq(t, dir)
	if _, err := call(ctx, hc, "PUT", p.base+"/v1/topics/"+topic, map[string]any{"queues": 4}, nil); err != nil {
		t.Fatal(err)
	}
	// pebblestore says so when it cannot sync its WAL through io_uring.
	t.Logf("WAL syncs through io_uring: %v", !strings.Contains(p.log.String(), "no io_uring"))
	kill(p)

	var (
		mu      sync.Mutex
		sent    = map[string]string{} // body → the id its 201 gave
		batches atomic.Int64
		dying   atomic.Bool // set before a kill: the sends in flight fail
	)
	cycle := func(c int) {
		p = startTidemq(t, dir, "--fsync", mode)
		dying.Store(false)
		loadCtx, stopLoad := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { // on t.Fatal too: no producer outlives its cycle
			stopLoad()
			wg.Wait()
		}()
		for g := range producers {
			wg.Go(func() {
				for b := 0; loadCtx.Err() == nil; b++ {
					msgs := make([]map[string]any, batchSize)
					for i := range msgs {
						msgs[i] = map[string]any{"body": fmt.Sprintf("c%d-p%d-b%06d-m%02d", c, g, b, i)}
					}
					var res struct{ Results []struct{ MessageID string } }
					status, err := call(loadCtx, hc, "POST", p.base+"/v1/topics/"+topic+"/messages:batch", map[string]any{"messages": msgs}, &res)
					if status != http.StatusCreated || err != nil || len(res.Results) != batchSize {
						if loadCtx.Err() == nil && !dying.Load() {
							t.Errorf("cycle %d: send: %d, %d results, %v", c, status, len(res.Results), err)
						}
						return
					}
					mu.Lock()
					for i, r := range res.Results {
						sent[msgs[i]["body"].(string)] = r.MessageID
					}
					mu.Unlock()
					batches.Add(1)
					// A few thousand messages a cycle are plenty, and
					// spare the machine's CPU.
					select {
					case <-loadCtx.Done():
					case <-time.After(10 * time.Millisecond):
					}
				}
			})
		}
		// Load for a second and at least 20 more batches (bounded), then
		// the kill and the power loss while sends are in flight.
		since := batches.Load()
		deadline := time.Now().Add(15 * time.Second)
		for start := time.Now(); time.Since(start) < time.Second || batches.Load() < since+20; {
			if t.Failed() {
				t.FailNow()
			}
			if time.Now().After(deadline) {
				t.Fatalf("cycle %d: %d batches acknowledged in 15 s", c, batches.Load()-since)
			}
			time.Sleep(10 * time.Millisecond)
		}
		dying.Store(true)
		kill(p)
	}
	for c := range cycles {
		cycle(c)
	}

	// Read everything back, on a broker with the defaults.
	p = startTidemq(t, dir)
	found := readBack(ctx, t, hc, p.base, topic)
	mu.Lock()
	defer mu.Unlock()
	for body, id := range sent {
		switch got, ok := found[body]; {
		case !ok:
			lost++
		case got != id:
			t.Errorf("%s came back as %s; its send answered %s", body, got, id)
		}
	}
	if len(sent) == 0 {
		t.Fatal("no send acknowledged")
	}
	return len(sent), lost, fs.Stats()
}
