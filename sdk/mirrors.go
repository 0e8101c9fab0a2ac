package sdk

import (
	"context"
	"net/http"
)

// Health answers GET /healthz: the process is up, and its region.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"healthz"}}, &h)
	return h, err
}

// PutMirror creates the mirror (created is true) or sets the configuration
// of the existing one (SPEC §8). The local topic must exist unless the
// broker auto-creates topics (ErrTopicNotFound).
func (c *Client) PutMirror(ctx context.Context, name string, cfg MirrorConfig) (m Mirror, created bool, err error) {
	status, err := c.do(ctx, request{method: http.MethodPut, path: []string{"v1", "mirrors", name}, in: cfg}, &m)
	return m, status == http.StatusCreated, err
}

// GetMirror returns the mirror with its state (ErrMirrorNotFound if none).
func (c *Client) GetMirror(ctx context.Context, name string) (Mirror, error) {
	var m Mirror
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "mirrors", name}}, &m)
	return m, err
}

// ListMirrors returns every mirror.
func (c *Client) ListMirrors(ctx context.Context) ([]Mirror, error) {
	var l MirrorList
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "mirrors"}}, &l)
	return l.Mirrors, err
}

// DeleteMirror stops and deletes the mirror; its copies stay.
func (c *Client) DeleteMirror(ctx context.Context, name string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: []string{"v1", "mirrors", name}}, nil)
	return err
}
