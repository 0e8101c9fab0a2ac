package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// localClusterUsage is the head of tidemq local-cluster --help.
const localClusterUsage = `Usage:
  tidemq local-cluster [flags]

Runs a cluster of N nodes of this binary on this machine, for trying
failover: node i listens on 127.0.0.i (or, where only 127.0.0.1 works, on
127.0.0.1 with port+i-1), keeps its data in DIR/n<i>, and logs prefixed
with its id. A node that dies stays dead; SIGINT or SIGTERM stops them all.
With --nodes 1 the node runs without cluster flags (a cluster of one).

Flags:
`

// localClusterConfig is what tidemq local-cluster was asked for.
type localClusterConfig struct {
	nodes       int
	dir         string
	port        int // HTTP
	clusterPort int // node-to-node
	stopTimeout time.Duration
}

func parseLocalCluster(args []string, output io.Writer) (localClusterConfig, error) {
	var c localClusterConfig
	fs := flag.NewFlagSet("tidemq local-cluster", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), localClusterUsage)
		fs.PrintDefaults()
	}
	fs.IntVar(&c.nodes, "nodes", 3, "number of nodes, 1 to 9")
	fs.StringVar(&c.dir, "dir", "./data-cluster", "directory of the nodes' data and the cluster's shared secret")
	fs.IntVar(&c.port, "port", 8081, "HTTP port of the nodes")
	fs.IntVar(&c.clusterPort, "cluster-port", 7001, "node-to-node port of the nodes")
	fs.DurationVar(&c.stopTimeout, "stop-timeout", 30*time.Second, "how long a node has to stop after SIGTERM before it gets SIGKILL")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q: tidemq local-cluster takes only flags", fs.Arg(0))
	}
	switch {
	case c.nodes < 1 || c.nodes > 9:
		return c, fmt.Errorf("--nodes %d: want 1 to 9", c.nodes)
	case c.dir == "":
		return c, errors.New("--dir is empty")
	case c.stopTimeout <= 0:
		return c, fmt.Errorf("--stop-timeout %v: want more than 0", c.stopTimeout)
	}
	for _, p := range []struct {
		name string
		port int
	}{{"port", c.port}, {"cluster-port", c.clusterPort}} {
		if p.port < 1 || p.port+c.nodes-1 > 65535 {
			return c, fmt.Errorf("--%s %d: want 1 to %d", p.name, p.port, 65536-c.nodes)
		}
	}
	if c.port == c.clusterPort || (c.port < c.clusterPort+c.nodes && c.clusterPort < c.port+c.nodes) {
		return c, fmt.Errorf("--port %d and --cluster-port %d overlap for %d nodes", c.port, c.clusterPort, c.nodes)
	}
	return c, nil
}

// localNode is one node of the local cluster.
type localNode struct {
	id                string
	httpAddr, cluster string // host:port
	data              string
}

// localLayout places the nodes: on 127.0.0.1…N with the same ports when
// distinctIPs, else all on 127.0.0.1 on consecutive ports.
func localLayout(c localClusterConfig, distinctIPs bool) []localNode {
	ns := make([]localNode, c.nodes)
	for i := range ns {
		ip, off := "127.0.0.1", i
		if distinctIPs {
			ip, off = fmt.Sprintf("127.0.0.%d", i+1), 0
		}
		id := fmt.Sprintf("n%d", i+1)
		ns[i] = localNode{
			id:       id,
			httpAddr: net.JoinHostPort(ip, strconv.Itoa(c.port+off)),
			cluster:  net.JoinHostPort(ip, strconv.Itoa(c.clusterPort+off)),
			data:     filepath.Join(c.dir, id),
		}
	}
	return ns
}

// localArgs are node i's flags; secret is the shared secret's file.
func localArgs(ns []localNode, i int, secret string) []string {
	n := ns[i]
	args := []string{"--addr", n.httpAddr, "--data", n.data}
	if len(ns) == 1 {
		return args
	}
	peers := make([]string, len(ns))
	for j, p := range ns {
		peers[j] = p.id + "=" + p.cluster
	}
	return append(args, "--node-id", n.id, "--cluster-addr", n.cluster,
		"--peers", strings.Join(peers, ","), "--cluster-secret", secret)
}

// loopbackAliases reports whether this machine can listen on 127.0.0.2
// to 127.0.0.n, as Linux can (all of 127.0.0.0/8), and macOS, for one,
// cannot without aliases.
func loopbackAliases(n int) bool {
	for i := 2; i <= n; i++ {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", i))
		if err != nil {
			return false
		}
		_ = ln.Close()
	}
	return true
}

// clusterSecret is the shared secret file in dir, made (32 random bytes,
// hex) when there is none.
func clusterSecret(dir string) (string, error) {
	path := filepath.Join(dir, "cluster-secret")
	if b, err := os.ReadFile(path); err == nil {
		if len(bytes.TrimSpace(b)) < 16 {
			return "", fmt.Errorf("%s: shorter than 16 bytes", path)
		}
		return path, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// prefixWriter writes each complete line it is given to out, prefixed;
// lines of all the nodes share out, one whole line at a time.
type prefixWriter struct {
	mu      *sync.Mutex
	out     io.Writer
	prefix  string
	partial []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.emit(w.partial[:i+1])
		w.partial = w.partial[i+1:]
	}
	return len(p), nil
}

// flush writes what is left of a last line without its newline.
func (w *prefixWriter) flush() {
	if len(w.partial) > 0 {
		w.emit(append(w.partial, '\n'))
		w.partial = nil
	}
}

func (w *prefixWriter) emit(line []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = io.WriteString(w.out, w.prefix)
	_, _ = w.out.Write(line)
}

// localClusterCommand runs tidemq local-cluster and returns its exit code.
func localClusterCommand(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseLocalCluster(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "tidemq local-cluster:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := runLocalCluster(ctx, cfg, stdout, log); err != nil {
		log.Error("local cluster stopped", "err", err)
		return 1
	}
	return 0
}

// runLocalCluster starts the nodes, forwards their logs to out, and once
// ctx ends stops them (SIGTERM, then SIGKILL after cfg.stopTimeout). It
// returns when every node has exited; the nodes' own failures are its error.
func runLocalCluster(ctx context.Context, cfg localClusterConfig, out io.Writer, log *slog.Logger) error {
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.dir, 0o755); err != nil {
		return err
	}
	secret := ""
	if cfg.nodes > 1 {
		if secret, err = clusterSecret(cfg.dir); err != nil {
			return err
		}
	}
	ns := localLayout(cfg, loopbackAliases(cfg.nodes))
	var outMu sync.Mutex
	type child struct {
		node localNode
		cmd  *exec.Cmd
		done chan struct{}
		err  error // valid after done
	}
	var children []*child
	exited := make(chan *child, len(ns))
	for i, n := range ns {
		pw := &prefixWriter{mu: &outMu, out: out, prefix: n.id + " | "}
		cmd := exec.Command(bin, localArgs(ns, i, secret)...)
		cmd.Stdout, cmd.Stderr = pw, pw
		if err = cmd.Start(); err != nil {
			err = fmt.Errorf("starting %s: %w", n.id, err)
			break
		}
		c := &child{node: n, cmd: cmd, done: make(chan struct{})}
		children = append(children, c)
		go func() {
			c.err = cmd.Wait()
			pw.flush()
			close(c.done)
			exited <- c
		}()
		outMu.Lock()
		fmt.Fprintf(out, "%s: console http://%s/ pid %d (data %s)\n", n.id, n.httpAddr, cmd.Process.Pid, n.data)
		outMu.Unlock()
	}
	if err == nil {
		outMu.Lock()
		if len(ns) > 1 {
			fmt.Fprintf(out, "kill -9 <pid> of one of them to see a failover; Ctrl-C stops them all (a killed node is not restarted)\n")
		} else {
			fmt.Fprintf(out, "Ctrl-C stops it\n")
		}
		outMu.Unlock()
	}

	// Nodes that die are reported, not restarted: seeing the others carry
	// on is the point.
	running := len(children)
	if err == nil {
	wait:
		for running > 0 {
			select {
			case <-ctx.Done():
				break wait
			case c := <-exited:
				running--
				log.Warn("node exited; not restarted", "node", c.node.id, "pid", c.cmd.Process.Pid, "err", c.err)
			}
		}
		if running == 0 {
			err = errors.New("every node exited")
		}
	}
	// Stop what still runs: SIGTERM to each, then wait, bounded.
	var stopping []*child
	for _, c := range children {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			stopping = append(stopping, c)
		}
	}
	deadline := time.After(cfg.stopTimeout)
	for _, c := range stopping {
		select {
		case <-c.done:
		case <-deadline:
			log.Warn("nodes did not stop after SIGTERM; SIGKILL", "timeout", cfg.stopTimeout)
			for _, c := range stopping {
				_ = c.cmd.Process.Kill()
			}
			<-c.done
		}
	}
	var failed []error
	for _, c := range stopping {
		if c.err != nil {
			failed = append(failed, fmt.Errorf("%s (pid %d): %w", c.node.id, c.cmd.Process.Pid, c.err))
		}
	}
	return errors.Join(err, errors.Join(failed...))
}
