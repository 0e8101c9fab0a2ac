package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidemq/tidemq/internal/listenlog"
)

// The backlog suite runs the real broker as a child process, so that its
// memory (RSS) is its own and a restart is a real one: built from
// ./cmd/tidemq with go build (or given with -broker-bin), started on a free
// loopback port, stopped with SIGTERM or SIGKILL. Whoever starts a
// brokerProc stops it: every path out of the suite, failures and
// cancellation included, kills it and waits for it (and on Linux the
// kernel kills it if the load tester dies first, see setPdeathsig).

// buildBroker builds the broker command into dir and returns its path. It
// must run inside the module (go run ./loadtest/cmd/tidemq-load from the
// repository, or go test); elsewhere pass -broker-bin.
func buildBroker(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "tidemq")
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/tidemq/tidemq/cmd/tidemq").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build github.com/tidemq/tidemq/cmd/tidemq (run inside the module, or give -broker-bin): %w\n%s", err, out)
	}
	return bin, nil
}

// brokerProc is one run of the broker binary.
type brokerProc struct {
	URL     string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited and was waited for
	waitErr error         // valid once done is closed
	logPath string
	// logStart is where this run's lines begin in logPath; began is when
	// the process was started.
	logStart int64
	began    time.Time
}

// startBrokerProc starts bin on dataDir on a loopback port of its own
// choosing, with --fsync always and --log-level info (then extra), its
// stdout and stderr appended to logPath, and waits until GET /readyz
// answers 200. It returns the time from starting the process to that
// answer. The environment is the load tester's without TIDEMQ_* and
// OTEL_* variables: the flags say it all, and no tokens, telemetry export
// or other setting slips in.
//
// The broker binds port 0 and the address comes from its "tidemq
// listening" log line. A port picked here and handed over could be taken
// in between by another program (under go test ./..., by another
// package's test server), and a /readyz answered by that server passed
// for ours while our broker had failed to bind.
func startBrokerProc(ctx context.Context, bin, dataDir, logPath string, readyTimeout time.Duration, extra ...string) (p *brokerProc, ready time.Duration, err error) {
	args := append([]string{"--data", dataDir, "--addr", "127.0.0.1:0", "--fsync", "always", "--log-level", "info"}, extra...)
	p, err = spawnBrokerProc(bin, logPath, args)
	if err != nil {
		return nil, 0, err
	}
	if err := p.waitReady(ctx, readyTimeout); err != nil {
		return p, 0, errors.Join(err, p.kill())
	}
	return p, time.Since(p.began), nil
}

// spawnBrokerProc starts bin with args (and the environment
// startBrokerProc describes), its stdout and stderr appended to logPath,
// without waiting for it: the nodes of a cluster are ready only once a
// quorum of them runs.
func spawnBrokerProc(bin, logPath string, args []string) (*brokerProc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "=== tidemq-load %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))
	logStart, err := logf.Seek(0, io.SeekEnd) // this run's lines follow
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TIDEMQ_") && !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if tracesEndpoint != "" {
		cmd.Env = append(cmd.Env, "OTEL_EXPORTER_OTLP_ENDPOINT="+tracesEndpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	setPdeathsig(cmd)
	p := &brokerProc{cmd: cmd, done: make(chan struct{}), logPath: logPath, logStart: logStart, began: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady waits until the broker's log names its address and GET
// /readyz there answers 200, setting p.URL; it fails if the broker exits,
// ctx ends or readyTimeout passes first.
func (p *brokerProc) waitReady(ctx context.Context, readyTimeout time.Duration) error {
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if p.URL == "" {
			if addr := listeningAddr(p.logPath, p.logStart); addr != "" {
				p.URL = "http://" + addr
			}
		}
		if p.URL != "" {
			req, err := http.NewRequestWithContext(ctx, "GET", p.URL+"/readyz", nil)
			if err != nil {
				return err
			}
			if resp, err := hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("the broker exited before it was ready: %v; its log (%s) ends:\n%s", p.waitErr, p.logPath, logTail(p.logPath))
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("the broker was not ready (listening on %q) after %v; its log (%s) ends:\n%s", p.URL, readyTimeout, p.logPath, logTail(p.logPath))
		case <-tick.C:
		}
	}
}

// listeningAddr is the address of the broker's listening line in logPath
// from offset on (the current run's lines), or "" while there is none.
func listeningAddr(logPath string, offset int64) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return ""
	}
	return listenlog.Addr(string(b))
}

// Pid is the broker's process id.
func (p *brokerProc) Pid() int { return p.cmd.Process.Pid }

// terminate sends SIGTERM and waits up to timeout for the process to exit
// (then kills it, and says so). It returns how long the exit took.
func (p *brokerProc) terminate(timeout time.Duration) (time.Duration, error) {
	began := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return 0, errors.Join(err, p.kill())
	}
	select {
	case <-p.done:
		took := time.Since(began)
		if p.waitErr != nil {
			return took, fmt.Errorf("the broker did not stop cleanly on SIGTERM: %v; its log (%s) ends:\n%s", p.waitErr, p.logPath, logTail(p.logPath))
		}
		return took, nil
	case <-time.After(timeout):
		return time.Since(began), errors.Join(fmt.Errorf("the broker was still running %v after SIGTERM: killed", timeout), p.kill())
	}
}

// kill sends SIGKILL (when the process still runs) and waits for it. It
// is safe to call at any time, and again.
func (p *brokerProc) kill() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-p.done
	return nil
}

// memory reads VmRSS (resident now) and VmHWM (the peak resident set of
// the process's life) from /proc/<pid>/status, in bytes.
func (p *brokerProc) memory() (rss, hwm int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		fields := strings.Fields(v) // "123456 kB"
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, 0, fmt.Errorf("/proc/%d/status: %s: %q", p.Pid(), k, v)
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, 0, err
		}
		if k == "VmRSS" {
			rss = n << 10
		} else {
			hwm = n << 10
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if rss == 0 || hwm == 0 {
		return rss, hwm, fmt.Errorf("/proc/%d/status has no VmRSS or VmHWM", p.Pid())
	}
	return rss, hwm, nil
}

// cpu is the CPU time (user and system) the process used so far, from
// /proc/<pid>/stat (0 when it cannot be read).
func (p *brokerProc) cpu() time.Duration { return p.usage().cpu }

// procUsage is what a process used so far: CPU time (user and system)
// and minor page faults (each a first touch of memory the process was
// given or gave back; on a VM a fault can cost ~10 µs, so a fresh
// process pays for memory its older self already holds).
type procUsage struct {
	cpu    time.Duration
	faults uint64
}

// usage reads the process's procUsage from /proc/<pid>/stat (zero when it
// cannot be read).
func (p *brokerProc) usage() procUsage {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
	if err != nil {
		return procUsage{}
	}
	// pid (comm) state ppid …: comm may hold spaces, so split after ")".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procUsage{}
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return procUsage{}
	}
	minflt, err0 := strconv.ParseUint(f[7], 10, 64) // field 10 of stat
	utime, err1 := strconv.ParseInt(f[11], 10, 64)  // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64)  // field 15
	if err0 != nil || err1 != nil || err2 != nil {
		return procUsage{}
	}
	const clockTicks = 100 // USER_HZ, 100 on every Linux ABI Go supports
	return procUsage{cpu: time.Duration(utime+stime) * time.Second / clockTicks, faults: minflt}
}

// freeAddr picks a free loopback port by listening on :0 and closing.

// logTail is the end of the broker's log, for error messages.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = append([]byte("…"), b[len(b)-4000:]...)
	}
	return string(b)
}

// dirBytes is the size of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// freeBytes is the space available to an unprivileged user where dir is.
func freeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
