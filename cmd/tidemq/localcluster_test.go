package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLocalClusterOneNode runs tidemq local-cluster --nodes 1 as a process:
// it prints its node's console URL and pid, the node answers /healthz, its
// log comes through prefixed with its id, and SIGTERM stops it and the node.
func TestLocalClusterOneNode(t *testing.T) {
	runLocalClusterTest(t, 1)
}

// TestLocalCluster is TestLocalClusterOneNode with 3 nodes on 127.0.0.1–3,
// once the binary has cluster flags.
func TestLocalCluster(t *testing.T) {
	if !binaryHasFlag(t, "node-id") {
		t.Skip("tidemq has no --node-id flag: no cluster to start")
	}
	runLocalClusterTest(t, 3)
}

var localNodeLine = regexp.MustCompile(`(?m)^(n\d+): console (http://\S+)/ pid (\d+) `)

func runLocalClusterTest(t *testing.T, nodes int) {
	var ips []string
	for i := range nodes {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i+1))
	}
	port := freeSharedPort(t, ips)
	clusterPort := freeSharedPort(t, ips, port)
	dir := t.TempDir()
	out := &syncBuffer{}
	cmd := exec.Command(tidemqBinary(t), "local-cluster", "--nodes", strconv.Itoa(nodes), "--dir", dir,
		"--port", strconv.Itoa(port), "--cluster-port", strconv.Itoa(clusterPort))
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var pids []int
	t.Cleanup(func() { // a failed test leaves no process behind
		_ = cmd.Process.Kill()
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("local-cluster output:\n%s", truncateLog(out.String()))
		}
	})

	// The printed lines: one per node, each with its URL and pid, then the
	// hint, written after the last node's line.
	var found [][]string
	deadline := time.Now().Add(20 * time.Second)
	for {
		printed := out.String()
		found = localNodeLine.FindAllStringSubmatch(printed, -1)
		if len(found) == nodes && strings.Contains(printed, "Ctrl-C stops") {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("local-cluster exited before printing its %d nodes: %v", nodes, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("local-cluster printed %d of %d nodes and its Ctrl-C line in 20 s", len(found), nodes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var urls []string
	for i, f := range found {
		pid, _ := strconv.Atoi(f[3])
		pids = append(pids, pid)
		urls = append(urls, f[2])
		if want := fmt.Sprintf("n%d", i+1); f[1] != want {
			t.Errorf("node line %d names %s, want %s", i, f[1], want)
		}
	}
	if nodes > 1 && !strings.Contains(out.String(), "to see a failover") {
		t.Error("no hint how to see a failover")
	}
	if nodes > 1 {
		if b, err := os.ReadFile(filepath.Join(dir, "cluster-secret")); err != nil || len(b) < 16 {
			t.Errorf("cluster secret: %d bytes, %v", len(b), err)
		}
	}
	if want := len(slices.Compact(slices.Sorted(slices.Values(urls)))); want != nodes {
		t.Errorf("URLs %v: want %d different ones", urls, nodes)
	}

	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	for i, u := range urls {
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := hc.Get(u + "/healthz")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			if time.Now().After(deadline) {
				t.Fatalf("n%d (%s): /healthz after 20 s: %v", i+1, u, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// Its own log, forwarded with its id in front.
		for !strings.Contains(out.String(), fmt.Sprintf("n%d | ", i+1)) {
			if time.Now().After(deadline) {
				t.Fatalf("no log line of n%d prefixed with its id", i+1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("local-cluster after SIGTERM: %v", err)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("local-cluster still running 40 s after SIGTERM")
	}
	// Its children are gone too (it waited for them, so none is a zombie).
	for i, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("n%d (pid %d) still there after local-cluster exited: %v", i+1, pid, err)
		}
	}
	if !strings.Contains(out.String(), "tidemq stopped cleanly") {
		t.Error("no node logged a clean stop")
	}
}

func TestLocalClusterFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodes", "0"}, "--nodes 0"},
		{[]string{"--nodes", "10"}, "--nodes 10"},
		{[]string{"--port", "0"}, "--port 0"},
		{[]string{"--port", "7001"}, "overlap"},
		{[]string{"--port", "7000"}, "overlap"}, // 7000–7002 against 7001–7003
		{[]string{"--dir", ""}, "--dir"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		_, err := parseLocalCluster(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
	c, err := parseLocalCluster(nil, io.Discard)
	if err != nil || c.nodes != 3 || c.dir != "./data-cluster" || c.port != 8081 || c.clusterPort != 7001 {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	secret := "/d/cluster-secret"
	for _, tc := range []struct {
		distinct bool
		want     []string // node 2's flags
	}{
		{true, []string{"--addr", "127.0.0.2:8081", "--data", "data-cluster/n2", "--node-id", "n2", "--cluster-addr", "127.0.0.2:7001",
			"--peers", "n1=127.0.0.1:7001,n2=127.0.0.2:7001,n3=127.0.0.3:7001", "--cluster-secret", secret}},
		{false, []string{"--addr", "127.0.0.1:8082", "--data", "data-cluster/n2", "--node-id", "n2", "--cluster-addr", "127.0.0.1:7002",
			"--peers", "n1=127.0.0.1:7001,n2=127.0.0.1:7002,n3=127.0.0.1:7003", "--cluster-secret", secret}},
	} {
		if got := localArgs(localLayout(c, tc.distinct), 1, secret); !slices.Equal(got, tc.want) {
			t.Errorf("distinct IPs %v: node 2 gets %q, want %q", tc.distinct, got, tc.want)
		}
	}
	c.nodes = 1
	if got := localArgs(localLayout(c, true), 0, ""); !slices.Equal(got, []string{"--addr", "127.0.0.1:8081", "--data", "data-cluster/n1"}) {
		t.Errorf("one node: %q, want no cluster flags", got)
	}
}
