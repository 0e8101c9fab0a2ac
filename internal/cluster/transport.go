package cluster

// Temporary stand-in for the authenticated transport (replaced at merge).

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

type Security struct {
	CertFile, KeyFile, CAFile string
	SecretFile                string
	Insecure                  bool
}

func (s Security) Check(listen, advertise string) error { return nil }

type Layer struct {
	ln        net.Listener
	advertise net.Addr
	info      func() []byte
}

func Listen(addr, advertise string, sec Security, info func() []byte) (*Layer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	a, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return nil, err
	}
	return &Layer{ln: ln, advertise: a, info: info}, nil
}

func (l *Layer) Accept() (net.Conn, error) {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return nil, err
		}
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			c.Close()
			continue
		}
		if b[0] == 'R' {
			return c, nil
		}
		go func() { c.Write(l.info()); c.Close() }()
	}
}
func (l *Layer) Close() error   { return l.ln.Close() }
func (l *Layer) Addr() net.Addr { return l.advertise }
func (l *Layer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", string(address), timeout)
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{'R'}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
func (l *Layer) Info(ctx context.Context, address string) ([]byte, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte{'I'}); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(c, 64<<10))
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, errors.New("empty info")
	}
	return b, nil
}
