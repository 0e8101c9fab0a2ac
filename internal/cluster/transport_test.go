package cluster

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func secretSecurity(t *testing.T, secret string) Security {
	return Security{SecretFile: writeFile(t, "secret", []byte(secret+"\n"))}
}

func testLayer(t *testing.T, sec Security, info func() []byte, opts ...LayerOption) *Layer {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	l, err := Listen("127.0.0.1:0", "", sec, info, append([]LayerOption{LayerLogger(log)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return l
}

// acceptAll feeds the raft connections l accepts to the returned channel, which
// is closed once Accept fails (after l.Close).
func acceptAll(t *testing.T, l *Layer) <-chan net.Conn {
	ch := make(chan net.Conn, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(ch)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
		for c := range ch {
			_ = c.Close()
		}
	})
	return ch
}

// expectAccepted asserts that the next connection Accept hands out is the other end of dialed.
func expectAccepted(t *testing.T, accepted <-chan net.Conn, dialed net.Conn) {
	t.Helper()
	select {
	case c := <-accepted:
		if got, want := c.RemoteAddr().String(), dialed.LocalAddr().String(); got != want {
			t.Fatalf("Accept handed out the connection from %s, want the one from %s", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept handed out nothing")
	}
}

func mustDial(t *testing.T, l *Layer, to *Layer) net.Conn {
	t.Helper()
	c, err := l.Dial(raft.ServerAddress(to.Addr().String()), 5*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// listFSM records the commands it applies.
type listFSM struct {
	mu  sync.Mutex
	cmd []string
}

func (f *listFSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cmd = append(f.cmd, string(l.Data))
	return nil
}

func (f *listFSM) applied() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.cmd...)
}

func (f *listFSM) Snapshot() (raft.FSMSnapshot, error) { return listSnapshot{}, nil }
func (f *listFSM) Restore(rc io.ReadCloser) error      { return rc.Close() }

type listSnapshot struct{}

func (listSnapshot) Persist(sink raft.SnapshotSink) error { return sink.Close() }
func (listSnapshot) Release()                             {}

// runRaftCluster starts a raft group of len(secs) nodes over real NetworkTransports on
// Layers, waits for a leader and commits one entry on every node.
func runRaftCluster(t *testing.T, secs []Security) {
	t.Helper()
	layers := make([]*Layer, len(secs))
	var servers []raft.Server
	for i, sec := range secs {
		layers[i] = testLayer(t, sec, nil)
		servers = append(servers, raft.Server{
			Suffrage: raft.Voter,
			ID:       raft.ServerID(fmt.Sprintf("n%d", i)),
			Address:  raft.ServerAddress(layers[i].Addr().String()),
		})
	}
	rafts := make([]*raft.Raft, len(secs))
	fsms := make([]*listFSM, len(secs))
	for i, l := range layers {
		trans := raft.NewNetworkTransport(l, 3, 5*time.Second, io.Discard)
		conf := raft.DefaultConfig()
		conf.LocalID = servers[i].ID
		conf.HeartbeatTimeout = 500 * time.Millisecond
		conf.ElectionTimeout = 500 * time.Millisecond
		conf.LeaderLeaseTimeout = 250 * time.Millisecond
		conf.CommitTimeout = 10 * time.Millisecond
		conf.LogOutput = io.Discard
		store := raft.NewInmemStore()
		fsms[i] = &listFSM{}
		r, err := raft.NewRaft(conf, fsms[i], store, store, raft.NewInmemSnapshotStore(), trans)
		if err != nil {
			t.Fatal(err)
		}
		rafts[i] = r
		t.Cleanup(func() {
			if err := r.Shutdown().Error(); err != nil {
				t.Errorf("raft shutdown: %v", err)
			}
			_ = trans.Close()
		})
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
			t.Fatal(err)
		}
	}
	var leader *raft.Raft
	waitFor(t, 30*time.Second, "a leader", func() bool {
		for _, r := range rafts {
			if r.State() == raft.Leader {
				leader = r
				return true
			}
		}
		return false
	})
	if err := leader.Apply([]byte("hello"), 10*time.Second).Error(); err != nil {
		t.Fatalf("apply: %v", err)
	}
	for i, f := range fsms {
		waitFor(t, 20*time.Second, fmt.Sprintf("n%d to apply the entry", i), func() bool {
			got := f.applied()
			return len(got) == 1 && got[0] == "hello"
		})
	}
}

func TestLayerRaftClusterSharedSecret(t *testing.T) {
	const secret = "a shared secret of the cluster"
	runRaftCluster(t, []Security{
		secretSecurity(t, secret), secretSecurity(t, secret), secretSecurity(t, secret),
	})
}

func TestLayerRaftClusterNoAuthLoopback(t *testing.T) {
	runRaftCluster(t, []Security{{}, {}, {}})
}

func TestLayerWrongSecretRefused(t *testing.T) {
	srv := testLayer(t, secretSecurity(t, "the right secret, 16+ bytes"), nil)
	accepted := acceptAll(t, srv)
	wrong := testLayer(t, secretSecurity(t, "the wrong secret, 16+ bytes"), nil)

	if c, err := wrong.Dial(raft.ServerAddress(srv.Addr().String()), 5*time.Second); err == nil {
		_ = c.Close()
		t.Fatal("dial with the wrong secret succeeded")
	}
	if _, err := wrong.Info(t.Context(), srv.Addr().String()); err == nil {
		t.Fatal("info with the wrong secret succeeded")
	}
	waitFor(t, 10*time.Second, "the server to refuse both", func() bool { return srv.refused.Load() == 2 })

	// The wrong-secret dialer gives up on the server's proof; this client goes on
	// regardless with a made-up proof of its own, so the server's check is what stops it.
	raw, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	hello := append(append([]byte(nil), secretMagic...), make([]byte, nonceBytes)...)
	_, _ = rand.Read(hello[len(secretMagic):])
	if _, err := raw.Write(hello); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, len(secretMagic)+nonceBytes+32)
	if _, err := io.ReadFull(raw, reply); err != nil {
		t.Fatal(err)
	}
	proof := make([]byte, 32)
	_, _ = rand.Read(proof)
	if _, err := raw.Write(append(proof, kindRaft)); err != nil {
		t.Fatal(err)
	}
	_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := raw.Read(make([]byte, 1)); err == nil {
		t.Fatalf("server answered %d byte(s) to a bad proof", n)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("server kept a connection with a bad proof open")
	}
	waitFor(t, 10*time.Second, "the server to refuse the bad proof", func() bool { return srv.refused.Load() == 3 })

	right := testLayer(t, secretSecurity(t, "the right secret, 16+ bytes"), nil)
	expectAccepted(t, accepted, mustDial(t, right, srv))
}

func TestLayerModeMismatchRefused(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	cases := []struct {
		name        string
		server, cli Security
	}{
		{"no auth to secret", secretSecurity(t, "a shared secret of the cluster"), Security{}},
		{"secret to no auth", Security{}, secretSecurity(t, "a shared secret of the cluster")},
		{"TLS to secret", secretSecurity(t, "a shared secret of the cluster"), ca.nodeSecurity(t, "n1", ca)},
		{"secret to TLS", ca.nodeSecurity(t, "n1", ca), secretSecurity(t, "a shared secret of the cluster")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := testLayer(t, tc.server, nil, LayerHandshakeTimeout(time.Second))
			accepted := acceptAll(t, srv)
			cli := testLayer(t, tc.cli, nil)
			if c, err := cli.Dial(raft.ServerAddress(srv.Addr().String()), 3*time.Second); err == nil {
				_ = c.Close()
				t.Fatal("dial succeeded")
			}
			waitFor(t, 10*time.Second, "the server to refuse", func() bool { return srv.refused.Load() == 1 })
			_ = srv.Close()
			if c, ok := <-accepted; ok {
				t.Fatalf("Accept handed out %s", c.RemoteAddr())
			}
		})
	}
}

func TestLayerInfo(t *testing.T) {
	sec := secretSecurity(t, "a shared secret of the cluster")
	srv := testLayer(t, sec, func() []byte { return []byte(`{"node":"n1"}`) })
	accepted := acceptAll(t, srv)
	cli := testLayer(t, sec, nil)

	for range 3 {
		got, err := cli.Info(t.Context(), srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != `{"node":"n1"}` {
			t.Fatalf("info = %q", got)
		}
	}
	// Info requests never reach Accept: the first connection it hands out is a raft dial.
	expectAccepted(t, accepted, mustDial(t, cli, srv))

	// A Layer without info answers with no bytes.
	got, err := srv.Info(t.Context(), cli.Addr().String())
	if err != nil || len(got) != 0 {
		t.Fatalf("info of a Layer without info func = %q, %v", got, err)
	}
}

func TestLayerInfoLimit(t *testing.T) {
	for _, size := range []int{maxInfoBytes, maxInfoBytes + 1} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			body := bytes.Repeat([]byte("x"), size)
			srv := testLayer(t, Security{}, func() []byte { return body })
			cli := testLayer(t, Security{}, nil)
			got, err := cli.Info(t.Context(), srv.Addr().String())
			if size <= maxInfoBytes {
				if err != nil || !bytes.Equal(got, body) {
					t.Fatalf("info of %d bytes: got %d bytes, %v", size, len(got), err)
				}
				return
			}
			if err == nil {
				t.Fatalf("info of %d bytes succeeded", size)
			}
		})
	}
}

func TestLayerInfoContext(t *testing.T) {
	// A listener that accepts and never answers stands for a hung peer.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Go(func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}
	})
	cli := testLayer(t, Security{}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = cli.Info(ctx, ln.Addr().String())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("info from a hung peer: %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("info took %s past its context", d)
	}
}

// testCA issues node certificates for tests.
type testCA struct {
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	pemDir string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pemDir: dir}
}

func (ca *testCA) file() string { return filepath.Join(ca.pemDir, "ca.pem") }

// issue writes a node certificate and key signed by ca. The certificate names a
// host that is not the address the node is dialed at, as a cluster's may.
func (ca *testCA) issue(t *testing.T, node string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: node},
		DNSNames:     []string{node + ".invalid"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = writeFile(t, node+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	keyFile = writeFile(t, node+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}

// nodeSecurity is mutual TLS with a certificate from ca, trusting the CA trusted.
func (ca *testCA) nodeSecurity(t *testing.T, node string, trusted *testCA) Security {
	cert, key := ca.issue(t, node)
	return Security{CertFile: cert, KeyFile: key, CAFile: trusted.file()}
}

func TestLayerRaftClusterMutualTLS(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	runRaftCluster(t, []Security{
		ca.nodeSecurity(t, "n0", ca), ca.nodeSecurity(t, "n1", ca), ca.nodeSecurity(t, "n2", ca),
	})
}

func TestLayerMutualTLSRefused(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	other := newTestCA(t, "another CA")
	srvSec := ca.nodeSecurity(t, "srv", ca)

	t.Run("client cert from another CA", func(t *testing.T) {
		logs := &lockedBuffer{}
		srv := testLayer(t, srvSec, nil, LayerLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
		accepted := acceptAll(t, srv)
		cli := testLayer(t, other.nodeSecurity(t, "intruder", ca), nil)
		if c, err := cli.Dial(raft.ServerAddress(srv.Addr().String()), 5*time.Second); err == nil {
			_ = c.Close()
			t.Fatal("dial succeeded")
		}
		if _, err := cli.Info(t.Context(), srv.Addr().String()); err == nil {
			t.Fatal("info succeeded")
		}
		waitFor(t, 10*time.Second, "the server to refuse", func() bool { return srv.refused.Load() == 2 })
		// A refusal is counted before it is reported: the second one's line
		// may still be on its way.
		waitFor(t, 10*time.Second, "both refusals reported", func() bool { return strings.Count(logs.String(), "refused connection") == 2 })
		if out := logs.String(); strings.Count(out, "unknown authority") != 2 {
			t.Fatalf("want both refusals for the certificate's authority, got:\n%s", out)
		}
		expectAccepted(t, accepted, mustDial(t, testLayer(t, ca.nodeSecurity(t, "n1", ca), nil), srv))
	})

	t.Run("server cert from another CA", func(t *testing.T) {
		// The server trusts the client's certificate; only the client's check of
		// the server's certificate can fail the dial.
		srv := testLayer(t, other.nodeSecurity(t, "impostor", ca), nil)
		accepted := acceptAll(t, srv)
		cli := testLayer(t, ca.nodeSecurity(t, "n1", ca), nil)
		c, err := cli.Dial(raft.ServerAddress(srv.Addr().String()), 5*time.Second)
		if err == nil {
			_ = c.Close()
			t.Fatal("dial to a server with a certificate from another CA succeeded")
		}
		if !errors.As(err, &x509.UnknownAuthorityError{}) {
			t.Fatalf("dial: %v, want an unknown authority error", err)
		}
		_ = srv.Close()
		if c, ok := <-accepted; ok {
			t.Fatalf("Accept handed out %s", c.RemoteAddr())
		}
	})

	t.Run("client without cert", func(t *testing.T) {
		srv := testLayer(t, srvSec, nil)
		accepted := acceptAll(t, srv)
		raw, err := tls.Dial("tcp", srv.Addr().String(), &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})
		if err == nil {
			defer raw.Close()
			_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err = raw.Write([]byte{kindRaft}); err == nil {
				var n int
				n, err = raw.Read(make([]byte, 1))
				if err == nil {
					t.Fatalf("server answered %d byte(s) to a client without a certificate", n)
				}
			}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("server kept a client without a certificate connected")
		}
		waitFor(t, 10*time.Second, "the server to refuse", func() bool { return srv.refused.Load() == 1 })
		expectAccepted(t, accepted, mustDial(t, testLayer(t, ca.nodeSecurity(t, "n1", ca), nil), srv))
	})
}

func TestLayerSilentClientDoesNotBlockOthers(t *testing.T) {
	sec := secretSecurity(t, "a shared secret of the cluster")
	// A handshake timeout far beyond the dial's: were handshakes run one at a
	// time, the dial would wait behind the silent clients and time out.
	srv := testLayer(t, sec, nil, LayerHandshakeTimeout(time.Minute))
	accepted := acceptAll(t, srv)
	var silent []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		silent = append(silent, c)
	}
	cli := testLayer(t, sec, nil)
	c, err := cli.Dial(raft.ServerAddress(srv.Addr().String()), 3*time.Second)
	if err != nil {
		t.Fatalf("dial behind silent clients: %v", err)
	}
	defer c.Close()
	expectAccepted(t, accepted, c)
	if _, err := cli.Info(t.Context(), srv.Addr().String()); err != nil {
		t.Fatalf("info behind silent clients: %v", err)
	}

	// Close aborts the silent clients' handshakes instead of waiting for their timeout.
	start := time.Now()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Close took %s", d)
	}
	for _, s := range silent {
		_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := s.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Fatalf("silent client after Close: %v, want EOF", err)
		}
	}
}

func TestLayerPendingHandshakesBounded(t *testing.T) {
	srv := testLayer(t, secretSecurity(t, "a shared secret of the cluster"), nil, LayerHandshakeTimeout(time.Minute))
	for range maxPendingHandshakes {
		c, err := net.Dial("tcp", srv.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitFor(t, 10*time.Second, "every slot taken", func() bool { return len(srv.slots) == maxPendingHandshakes })
	extra, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("connection beyond the handshake slots: %v, want EOF at once", err)
	}
	waitFor(t, 5*time.Second, "the refusal to be counted", func() bool { return srv.refused.Load() == 1 })
}

func TestLayerHandshakeTimeout(t *testing.T) {
	srv := testLayer(t, secretSecurity(t, "a shared secret of the cluster"), nil, LayerHandshakeTimeout(300*time.Millisecond))
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("silent client: %v, want EOF once the handshake times out", err)
	}
	waitFor(t, 5*time.Second, "the refusal to be counted", func() bool { return srv.refused.Load() == 1 })
}

func TestLayerClose(t *testing.T) {
	srv := testLayer(t, Security{}, nil)
	cli := testLayer(t, Security{}, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := srv.Accept()
		errc <- err
	}()
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still blocked after Close")
	}
	if err := srv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := cli.Dial(raft.ServerAddress(srv.Addr().String()), time.Second); err == nil {
		t.Fatal("dial to a closed Layer succeeded")
	}
	if _, err := srv.Dial(raft.ServerAddress(cli.Addr().String()), time.Second); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Dial from a closed Layer: %v, want net.ErrClosed", err)
	}
	if _, err := srv.Info(t.Context(), cli.Addr().String()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Info from a closed Layer: %v, want net.ErrClosed", err)
	}
}

func TestLayerAddr(t *testing.T) {
	l, err := Listen("127.0.0.1:0", "localhost:7999", Security{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Addr().String(); got != "localhost:7999" {
		t.Fatalf("Addr = %q, want the advertise address", got)
	}
	l2 := testLayer(t, Security{}, nil)
	if a, ok := l2.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() || a.Port == 0 {
		t.Fatalf("Addr without advertise = %v, want the bound address", l2.Addr())
	}
	if _, err := Listen("127.0.0.1:0", "10.1.2.3:7000", Security{}, nil); err == nil {
		t.Fatal("Listen advertising beyond loopback without authentication succeeded")
	}
}

// lockedBuffer collects log output written from the Layer's goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestLayerRefusalLogRateLimited(t *testing.T) {
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	l, err := Listen("127.0.0.1:0", "", Security{}, nil, LayerLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for range 5 {
		l.refuse(l.Addr(), errors.New("bad"))
	}
	out := logs.String()
	if w, d := strings.Count(out, "level=WARN"), strings.Count(out, "level=DEBUG"); w != 1 || d != 4 {
		t.Fatalf("5 refusals logged %d warnings and %d debug lines, want 1 and 4:\n%s", w, d, out)
	}
}

func TestSecurityCheck(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	cert, key := ca.issue(t, "n1")
	secret := writeFile(t, "secret", []byte("0123456789abcdef\n")) // 16 bytes once the newline is trimmed
	crlfSecret := writeFile(t, "secret", []byte("0123456789abcdef\r\n"))
	short := writeFile(t, "short", []byte("0123456789abcde\n"))
	notPEM := writeFile(t, "ca.pem", []byte("not a certificate"))
	missing := filepath.Join(t.TempDir(), "missing")
	tlsSec := Security{CertFile: cert, KeyFile: key, CAFile: ca.file()}

	const lo, wide = "127.0.0.1:7000", "10.0.0.1:7000"
	cases := []struct {
		name              string
		sec               Security
		listen, advertise string
		wantErr           string // substring; "" for no error
	}{
		{"none on loopback", Security{}, lo, "", ""},
		{"none on 127/8", Security{}, "127.3.2.1:7000", "127.0.0.2:7000", ""},
		{"none on localhost", Security{}, "localhost:7000", "LOCALHOST:7000", ""},
		{"none on ::1", Security{}, "[::1]:7000", "", ""},
		{"none on mapped loopback", Security{}, "[::ffff:127.0.0.1]:7000", "", ""},
		{"none on all interfaces", Security{}, ":7000", "", "beyond loopback"},
		{"none on 0.0.0.0", Security{}, "0.0.0.0:7000", "", "beyond loopback"},
		{"none on a LAN address", Security{}, wide, "", "beyond loopback"},
		{"none on a host name", Security{}, "node1:7000", "", "beyond loopback"},
		{"none advertising a LAN address", Security{}, lo, wide, "beyond loopback"},
		{"none insecure", Security{Insecure: true}, wide, wide, ""},
		{"bad address", Security{}, "127.0.0.1", "", "missing port"},
		{"bad advertise", Security{SecretFile: secret}, wide, "node1", "missing port"},
		{"secret", Security{SecretFile: secret}, wide, "", ""},
		{"secret with CRLF", Security{SecretFile: crlfSecret}, wide, "", ""},
		{"secret too short", Security{SecretFile: short}, wide, "", "need at least 16"},
		{"secret missing", Security{SecretFile: missing}, wide, "", "secret file"},
		{"tls", tlsSec, wide, wide, ""},
		{"tls without key", Security{CertFile: cert, CAFile: ca.file()}, wide, "", "missing key"},
		{"tls with CA only", Security{CAFile: ca.file()}, lo, "", "missing cert, key"},
		{"tls and secret", Security{CertFile: cert, KeyFile: key, CAFile: ca.file(), SecretFile: secret}, wide, "", "choose one"},
		{"tls CA not PEM", Security{CertFile: cert, KeyFile: key, CAFile: notPEM}, wide, "", "no PEM certificate"},
		{"tls CA missing", Security{CertFile: cert, KeyFile: key, CAFile: missing}, wide, "", "TLS CA"},
		{"tls key is the cert", Security{CertFile: cert, KeyFile: cert, CAFile: ca.file()}, wide, "", "key pair"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.sec.Check(tc.listen, tc.advertise)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Fatalf("Check passed, want an error with %q", tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Fatalf("Check: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}

	// Every problem is reported, not only the first.
	err := Security{CertFile: cert, SecretFile: short}.Check(wide, "")
	for _, want := range []string{"missing key, CA", "choose one", "need at least 16"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Check: %v, want it to include %q", err, want)
		}
	}
}
