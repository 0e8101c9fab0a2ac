package cluster

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Security says how nodes authenticate each other. Zero value: no authentication.
//
// With a shared secret, each connection starts with a mutual challenge–response
// that proves both ends hold the secret; the traffic after it is neither
// encrypted nor integrity-protected, so a network where an attacker can sit on
// the path between nodes needs mutual TLS instead.
//
// With mutual TLS, every certificate issued by the CA is a cluster node: use a
// CA dedicated to the cluster. Node certificates serve both ends of a
// connection, so they need the serverAuth and clientAuth extended key usages
// (or none); their names are not checked, since nodes are addressed by ip:port.
type Security struct {
	CertFile, KeyFile, CAFile string // mutual TLS: all three, or none
	SecretFile                string // shared secret (a file; its bytes, trailing newline trimmed, min 16 bytes)
	Insecure                  bool   // allow no authentication beyond loopback
}

// minSecretBytes keeps a shared secret out of reach of guessing from observed handshakes.
const minSecretBytes = 16

// Check validates the settings against the listen and advertise addresses: TLS files all-or-none,
// not both TLS and a secret, files readable, secret long enough; neither TLS nor secret with an address
// that is not loopback (127.0.0.0/8, ::1, "localhost") is an error unless Insecure.
// An empty advertise address stands for the listen address. Every problem found is reported (errors.Join).
func (s Security) Check(listen, advertise string) error {
	_, err := s.check(listen, advertise)
	return err
}

// check is Check returning the loaded key material as well, so Listen reads each file once.
func (s Security) check(listen, advertise string) (*layerKeys, error) {
	var errs []error
	addrs := []string{listen}
	if advertise != "" {
		addrs = append(addrs, advertise)
	}
	loopback := true
	for _, a := range addrs {
		lo, err := isLoopbackHostPort(a)
		if err != nil {
			errs = append(errs, err)
		}
		loopback = loopback && lo
	}

	keys := &layerKeys{}
	tlsGiven := 0
	for _, f := range []string{s.CertFile, s.KeyFile, s.CAFile} {
		if f != "" {
			tlsGiven++
		}
	}
	switch {
	case tlsGiven == 3:
		server, client, err := loadClusterTLS(s.CertFile, s.KeyFile, s.CAFile)
		if err != nil {
			errs = append(errs, err)
		}
		keys.serverTLS, keys.clientTLS = server, client
	case tlsGiven > 0:
		var missing []string
		for _, f := range []struct{ name, path string }{{"cert", s.CertFile}, {"key", s.KeyFile}, {"CA", s.CAFile}} {
			if f.path == "" {
				missing = append(missing, f.name)
			}
		}
		errs = append(errs, fmt.Errorf("cluster security: mutual TLS needs the cert, key and CA files together (missing %s)",
			strings.Join(missing, ", ")))
	}
	if s.SecretFile != "" {
		if tlsGiven > 0 {
			errs = append(errs, errors.New("cluster security: both TLS files and a shared secret given; choose one"))
		}
		secret, err := loadSecret(s.SecretFile)
		if err != nil {
			errs = append(errs, err)
		}
		keys.secret = secret
	}
	if tlsGiven == 0 && s.SecretFile == "" && !loopback && !s.Insecure {
		errs = append(errs, fmt.Errorf("cluster security: node-to-node traffic on %s goes beyond loopback: "+
			"it needs mutual TLS files or a shared secret file, or insecure mode", strings.Join(addrs, " / ")))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return keys, nil
}

// isLoopbackHostPort reports whether addr's host is a loopback IP or "localhost".
// An empty host (all interfaces) is not loopback.
func isLoopbackHostPort(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("cluster security: address %q: %w", addr, err)
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return false, nil // a host name other than localhost may resolve anywhere
	}
	return ip.Unmap().IsLoopback(), nil
}

func loadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster security: secret file: %w", err)
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) < minSecretBytes {
		return nil, fmt.Errorf("cluster security: secret file %s: %d bytes, need at least %d", path, len(b), minSecretBytes)
	}
	return b, nil
}

// loadClusterTLS builds the two ends' configurations: both present the node's
// certificate, both require the peer's to chain to the CA, neither checks host names.
func loadClusterTLS(certFile, keyFile, caFile string) (server, client *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster security: TLS key pair %s, %s: %w", certFile, keyFile, err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster security: TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, nil, fmt.Errorf("cluster security: TLS CA %s: no PEM certificate in it", caFile)
	}
	server = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	client = &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Always present the node's certificate, even when it is not issued by one of
		// the CAs the server names, so the server's verification decides.
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil },
		RootCAs:              pool,
		// Nodes dial each other by ip:port, which their certificates need not name, so
		// the standard verification (chain and host name) is switched off and
		// VerifyConnection does the chain part against the cluster CA; it also runs on
		// resumed sessions, unlike VerifyPeerCertificate.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyClusterPeer(cs.PeerCertificates, pool)
		},
	}
	return server, client, nil
}

// verifyClusterPeer checks that a server's certificate chains to the cluster CA
// and may authenticate a server, without a host name check.
func verifyClusterPeer(certs []*x509.Certificate, roots *x509.CertPool) error {
	if len(certs) == 0 {
		return errors.New("cluster transport: peer sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{
		Roots:         roots,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("cluster transport: peer certificate: %w", err)
	}
	return nil
}

// layerKeys is the loaded form of a Security: at most one of secret and the TLS pair is set.
type layerKeys struct {
	secret               []byte
	serverTLS, clientTLS *tls.Config
}

// Wire format. Every connection starts with the security step of the mode
// (nothing, a TLS handshake, or the secret handshake below), then the dialer
// writes one kind byte. For kindRaft the acceptor answers connAccepted and the
// connection belongs to raft; for kindInfo it answers a 4-byte big-endian
// length and that many info bytes, then closes. The answer lets the dialer know
// it was accepted before it returns: in TLS 1.3 the server judges the client's
// certificate after the client considers the handshake done.
//
// Secret handshake, with nonces of nonceBytes random bytes:
//
//	dialer   → acceptor: secretMagic, nonceD
//	acceptor → dialer:   secretMagic, nonceA, HMAC(secret, roleAcceptor||nonceA||nonceD)
//	dialer   → acceptor: HMAC(secret, roleDialer||nonceD||nonceA)
//
// The roles in the MACs keep one side's proof from being replayed as the other's.
const (
	kindRaft     byte = 'R'
	kindInfo     byte = 'I'
	connAccepted byte = 'A'

	nonceBytes   = 32
	maxInfoBytes = 64 << 10

	// defaultHandshakeTimeout bounds the accept side's handshake, so a silent or slow
	// peer holds a handshake slot only this long.
	defaultHandshakeTimeout = 5 * time.Second
	// infoTimeout bounds Info when its context has no earlier deadline.
	infoTimeout = 10 * time.Second
	// maxPendingHandshakes caps accept-side handshakes in flight; connections beyond it are closed at once.
	maxPendingHandshakes = 128
	// refusalLogInterval is the least time between two warnings about refused connections.
	refusalLogInterval = 10 * time.Second
)

var (
	secretMagic  = []byte("tmq1")
	roleDialer   = []byte("tidemq cluster dialer  ")
	roleAcceptor = []byte("tidemq cluster acceptor")
)

func handshakeMAC(secret, role, own, peer []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(role)
	m.Write(own)
	m.Write(peer)
	return m.Sum(nil)
}

func secretDial(c net.Conn, secret []byte) error {
	hello := make([]byte, 0, len(secretMagic)+nonceBytes)
	hello = append(hello, secretMagic...)
	hello = append(hello, make([]byte, nonceBytes)...)
	own := hello[len(secretMagic):]
	_, _ = rand.Read(own)
	if _, err := c.Write(hello); err != nil {
		return err
	}
	reply := make([]byte, len(secretMagic)+nonceBytes+sha256.Size)
	if _, err := io.ReadFull(c, reply); err != nil {
		return err
	}
	if !bytes.Equal(reply[:len(secretMagic)], secretMagic) {
		return errors.New("peer does not speak the shared-secret handshake")
	}
	peer := reply[len(secretMagic) : len(secretMagic)+nonceBytes]
	if bytes.Equal(peer, own) {
		return errors.New("peer echoed our nonce")
	}
	if !hmac.Equal(reply[len(secretMagic)+nonceBytes:], handshakeMAC(secret, roleAcceptor, peer, own)) {
		return errors.New("peer does not hold the shared secret")
	}
	_, err := c.Write(handshakeMAC(secret, roleDialer, own, peer))
	return err
}

func secretAccept(c net.Conn, secret []byte) error {
	hello := make([]byte, len(secretMagic)+nonceBytes)
	if _, err := io.ReadFull(c, hello); err != nil {
		return err
	}
	if !bytes.Equal(hello[:len(secretMagic)], secretMagic) {
		return errors.New("peer does not speak the shared-secret handshake")
	}
	peer := hello[len(secretMagic):]
	own := make([]byte, nonceBytes)
	_, _ = rand.Read(own)
	if bytes.Equal(peer, own) {
		return errors.New("peer echoed our nonce")
	}
	reply := make([]byte, 0, len(secretMagic)+nonceBytes+sha256.Size)
	reply = append(reply, secretMagic...)
	reply = append(reply, own...)
	reply = append(reply, handshakeMAC(secret, roleAcceptor, own, peer)...)
	if _, err := c.Write(reply); err != nil {
		return err
	}
	proof := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, proof); err != nil {
		return err
	}
	if !hmac.Equal(proof, handshakeMAC(secret, roleDialer, peer, own)) {
		return errors.New("peer does not hold the shared secret")
	}
	return nil
}

// LayerOption adjusts a Layer at Listen.
type LayerOption func(*layerOptions)

type layerOptions struct {
	logger           *slog.Logger
	handshakeTimeout time.Duration
}

// LayerLogger sets where refused connections are reported (default slog.Default()).
func LayerLogger(l *slog.Logger) LayerOption {
	return func(o *layerOptions) {
		if l != nil {
			o.logger = l
		}
	}
}

// LayerHandshakeTimeout bounds each accept-side handshake (default 5 s).
func LayerHandshakeTimeout(d time.Duration) LayerOption {
	return func(o *layerOptions) {
		if d > 0 {
			o.handshakeTimeout = d
		}
	}
}

// Layer is a raft.StreamLayer over TCP with the handshake of Security, multiplexing two kinds of
// connection on the one port: raft's (handed to Accept) and info requests (answered with the
// bytes info() returns, then closed, never reaching Accept).
//
// Handshakes of incoming connections run concurrently in goroutines the Layer
// owns, each bounded by the handshake timeout; Close stops and waits for all of
// them. Connections returned by Accept and Dial belong to the caller. A Layer
// is safe for concurrent use.
type Layer struct {
	ln        net.Listener
	advertise net.Addr
	keys      *layerKeys
	info      func() []byte
	log       *slog.Logger
	timeout   time.Duration

	raftConns chan net.Conn
	slots     chan struct{}
	done      chan struct{}
	wg        sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	pending map[net.Conn]struct{} // connections in a handshake, closed by Close

	refused    atomic.Int64 // incoming connections refused, for tests and diagnostics
	logMu      sync.Mutex
	nextWarn   time.Time
	suppressed int
}

var _ raft.StreamLayer = (*Layer)(nil)

// advertiseAddr keeps the advertise address as written (a host name stays a
// name), since raft sends Addr().String() to its peers to dial.
type advertiseAddr string

func (a advertiseAddr) Network() string { return "tcp" }
func (a advertiseAddr) String() string  { return string(a) }

// Listen checks sec (see Security.Check), listens on addr and starts accepting.
// advertise is the address other nodes dial (default: the bound address, which
// must then be a specific IP). info supplies the answer to Info requests; nil
// answers with no bytes. Close the raft.NetworkTransport built on the Layer
// (it closes the Layer) rather than the Layer alone, or raft's accept loop logs
// errors until its transport is closed too.
func Listen(addr, advertise string, sec Security, info func() []byte, opts ...LayerOption) (*Layer, error) {
	keys, err := sec.check(addr, advertise)
	if err != nil {
		return nil, err
	}
	o := layerOptions{logger: slog.Default(), handshakeTimeout: defaultHandshakeTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if advertise != "" {
		if _, port, _ := net.SplitHostPort(advertise); port == "0" || port == "" {
			return nil, fmt.Errorf("cluster transport: advertise address %q needs a port", advertise)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cluster transport: %w", err)
	}
	var adv net.Addr = advertiseAddr(advertise)
	if advertise == "" {
		bound, ok := ln.Addr().(*net.TCPAddr)
		if !ok || bound.IP == nil || bound.IP.IsUnspecified() {
			_ = ln.Close()
			return nil, fmt.Errorf("cluster transport: listening on %s (all interfaces) needs an advertise address", ln.Addr())
		}
		adv = bound
	}
	if info == nil {
		info = func() []byte { return nil }
	}
	l := &Layer{
		ln:        ln,
		advertise: adv,
		keys:      keys,
		info:      info,
		log:       o.logger.With("component", "cluster-transport"),
		timeout:   o.handshakeTimeout,
		raftConns: make(chan net.Conn),
		slots:     make(chan struct{}, maxPendingHandshakes),
		done:      make(chan struct{}),
		pending:   map[net.Conn]struct{}{},
	}
	l.wg.Go(l.acceptLoop)
	return l, nil
}

// Accept returns the next authenticated raft connection. After Close it
// returns an error wrapping net.ErrClosed.
func (l *Layer) Accept() (net.Conn, error) {
	select {
	case c := <-l.raftConns:
		return c, nil
	case <-l.done:
		return nil, l.errClosed()
	}
}

// Close stops accepting, aborts handshakes in progress and waits for the
// goroutines of the Layer. Idempotent: later calls return nil.
func (l *Layer) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	pending := l.pending
	l.pending = nil
	l.mu.Unlock()

	err := l.ln.Close()
	for c := range pending {
		_ = c.Close()
	}
	l.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Addr returns the advertise address (raft puts it in its RPCs).
func (l *Layer) Addr() net.Addr { return l.advertise }

// Dial connects to a node's Layer for raft, authenticates both ends and
// returns the connection once the peer has accepted it. timeout bounds the
// whole (default: the handshake timeout).
func (l *Layer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 {
		timeout = l.timeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, _, err := l.dial(ctx, string(address), kindRaft)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Info dials address, authenticates, asks for its info bytes and returns them (max 64 KiB).
// ctx bounds the exchange, which gives up after 10 s anyway.
func (l *Layer) Info(ctx context.Context, address string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, infoTimeout)
	defer cancel()
	c, info, err := l.dial(ctx, address, kindInfo)
	if err != nil {
		return nil, err
	}
	_ = c.Close()
	return info, nil
}

// dial connects, runs the security step and sends kind; for raft it waits for
// the acceptor's answer, for info it reads the info bytes. The connection is
// aborted if the Layer closes meanwhile.
func (l *Layer) dial(ctx context.Context, address string, kind byte) (net.Conn, []byte, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster transport: dial %s: %w", address, err)
	}
	if !l.track(raw) {
		_ = raw.Close()
		return nil, nil, l.errClosed()
	}
	defer l.untrack(raw)
	var info []byte
	c, err := guard(ctx, l, raw, address, func() (net.Conn, error) {
		c := raw
		switch {
		case l.keys.clientTLS != nil:
			tc := tls.Client(raw, l.keys.clientTLS)
			if err := tc.Handshake(); err != nil {
				return nil, err
			}
			c = tc
		case l.keys.secret != nil:
			if err := secretDial(raw, l.keys.secret); err != nil {
				return nil, err
			}
		}
		if _, err := c.Write([]byte{kind}); err != nil {
			return nil, err
		}
		if kind == kindInfo {
			var err error
			info, err = readInfo(c)
			return c, err
		}
		var ack [1]byte
		if _, err := io.ReadFull(c, ack[:]); err != nil {
			return nil, fmt.Errorf("not accepted by peer: %w", err)
		}
		if ack[0] != connAccepted {
			return nil, fmt.Errorf("peer answered %q, not a cluster transport", ack[0])
		}
		return c, nil
	})
	if err != nil {
		_ = raw.Close()
		return nil, nil, err
	}
	return c, info, nil
}

func readInfo(c net.Conn) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, fmt.Errorf("no info from peer: %w", err)
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxInfoBytes {
		return nil, fmt.Errorf("info of %d bytes is over the %d limit", size, maxInfoBytes)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, fmt.Errorf("info from peer: %w", err)
	}
	return b, nil
}

// guard runs fn on c under ctx: ctx ending (deadline or cancellation)
// interrupts fn's I/O, and fn's error then wraps ctx.Err().
func guard[T any](ctx context.Context, l *Layer, c net.Conn, address string, fn func() (T, error)) (T, error) {
	var zero T
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	v, err := fn()
	stopped := stop()
	if err == nil && !stopped {
		err = ctx.Err()
	}
	if err != nil {
		if l.isClosed() {
			return zero, l.errClosed()
		}
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w (%w)", ctxErr, err)
		}
		return zero, fmt.Errorf("cluster transport: %s: %w", address, err)
	}
	return v, nil
}

func (l *Layer) acceptLoop() {
	var delay time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if l.isClosed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Running out of descriptors and the like pass; retry without spinning.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			l.log.Warn("cluster transport: accept failed", "err", err, "retry_in", delay)
			select {
			case <-l.done:
				return
			case <-time.After(delay):
			}
			continue
		}
		delay = 0
		select {
		case l.slots <- struct{}{}:
		default:
			_ = c.Close()
			l.refuse(c.RemoteAddr(), errors.New("too many handshakes in progress"))
			continue
		}
		if !l.track(c) {
			_ = c.Close()
			<-l.slots
			return
		}
		l.wg.Go(func() { l.serve(c) })
	}
}

// serve authenticates one incoming connection and hands it to Accept or answers its info request.
func (l *Layer) serve(raw net.Conn) {
	_ = raw.SetDeadline(time.Now().Add(l.timeout))
	c, kind, err := l.acceptHandshake(raw)
	if err == nil && kind == kindInfo {
		err = l.answerInfo(c)
	}
	l.untrack(raw)
	<-l.slots // the slot bounds handshakes only, not connections waiting for Accept
	if err != nil {
		_ = c.Close()
		if !l.isClosed() {
			l.refuse(raw.RemoteAddr(), err)
		}
		return
	}
	if kind == kindInfo {
		_ = c.Close()
		return
	}
	_ = raw.SetDeadline(time.Time{})
	select {
	case l.raftConns <- c:
	case <-l.done:
		_ = c.Close()
	}
}

func (l *Layer) acceptHandshake(raw net.Conn) (net.Conn, byte, error) {
	c := raw
	switch {
	case l.keys.serverTLS != nil:
		tc := tls.Server(raw, l.keys.serverTLS)
		if err := tc.Handshake(); err != nil {
			return c, 0, err
		}
		c = tc
	case l.keys.secret != nil:
		if err := secretAccept(raw, l.keys.secret); err != nil {
			return c, 0, err
		}
	}
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); err != nil {
		return c, 0, err
	}
	switch kind[0] {
	case kindRaft:
		if _, err := c.Write([]byte{connAccepted}); err != nil {
			return c, 0, err
		}
	case kindInfo:
	default:
		return c, 0, fmt.Errorf("unknown connection kind %q", kind[0])
	}
	return c, kind[0], nil
}

func (l *Layer) answerInfo(c net.Conn) error {
	b := l.info()
	if len(b) > maxInfoBytes {
		return fmt.Errorf("info of %d bytes is over the %d limit", len(b), maxInfoBytes)
	}
	msg := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(msg, uint32(len(b)))
	msg = append(msg, b...)
	_, err := c.Write(msg)
	return err
}

// refuse counts a refused connection and reports it: a warning at most every
// refusalLogInterval (with how many went unreported since), the rest at debug,
// so a scanner or a misconfigured peer cannot flood the log.
func (l *Layer) refuse(remote net.Addr, err error) {
	l.refused.Add(1)
	now := time.Now()
	l.logMu.Lock()
	warn := !now.Before(l.nextWarn)
	suppressed := l.suppressed
	if warn {
		l.nextWarn = now.Add(refusalLogInterval)
		l.suppressed = 0
	} else {
		l.suppressed++
	}
	l.logMu.Unlock()
	if warn {
		l.log.Warn("cluster transport: refused connection", "remote_addr", remote.String(), "err", err,
			"refused_unreported", suppressed)
		return
	}
	l.log.Debug("cluster transport: refused connection", "remote_addr", remote.String(), "err", err)
}

func (l *Layer) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.pending[c] = struct{}{}
	return true
}

func (l *Layer) untrack(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, c) // no-op on the nil map after Close
}

func (l *Layer) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

func (l *Layer) errClosed() error {
	return fmt.Errorf("cluster transport: %w", net.ErrClosed)
}
