package sdk_test

import (
	"errors"
	"testing"

	"github.com/tidemq/tidemq/sdk"
)

// The mirror calls round-trip against the real server (no runner: the
// mirror is only defined), and their errors are values errors.Is knows.
func TestMirrorCalls(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	c := newClient(t, srv.URL)
	ctx := t.Context()
	h, err := c.Health(ctx)
	if err != nil || h.Status != "ok" || h.Region != "local" {
		t.Fatalf("Health = %+v, %v", h, err)
	}
	topic := topicName("mirrored")
	if _, _, err := c.PutTopic(ctx, topic, sdk.TopicConfig{}); err != nil {
		t.Fatal(err)
	}
	maxLag := int64(100)
	cfg := sdk.MirrorConfig{Source: sdk.MirrorSource{URL: "http://hz.example:8080", Topic: "orders", Token: "secret"},
		Topic: topic, Filter: "TagA", Alerts: &sdk.MirrorAlerts{MaxLag: &maxLag}}
	m, created, err := c.PutMirror(ctx, "from-hz", cfg)
	if err != nil || !created {
		t.Fatalf("PutMirror: created %v, %v", created, err)
	}
	if m.Name != "from-hz" || m.Topic != topic || m.Filter != "TagA" || m.StartFrom != "earliest" || m.State != sdk.MirrorRunning ||
		m.Source.Token != "" || m.LastCopiedAt != nil || m.LastError != nil || m.Alerts == nil || *m.Alerts.MaxLag != 100 {
		t.Errorf("created %+v", m)
	}
	cfg.State = sdk.MirrorPaused
	if m, created, err = c.PutMirror(ctx, "from-hz", cfg); err != nil || created || m.State != sdk.MirrorPaused {
		t.Errorf("update: %+v, created %v, %v", m, created, err)
	}
	if got, err := c.GetMirror(ctx, "from-hz"); err != nil || got.State != sdk.MirrorPaused {
		t.Errorf("GetMirror = %+v, %v", got, err)
	}
	if l, err := c.ListMirrors(ctx); err != nil || len(l) != 1 || l[0].Name != "from-hz" {
		t.Errorf("ListMirrors = %+v, %v", l, err)
	}
	if _, _, err := c.PutMirror(ctx, "bad", sdk.MirrorConfig{Source: sdk.MirrorSource{URL: "hz", Topic: "orders"}, Topic: topic}); !errors.Is(err, sdk.ErrRejected) {
		t.Errorf("bad source URL: %v, want a rejection", err)
	}
	if err := c.DeleteMirror(ctx, "from-hz"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetMirror(ctx, "from-hz"); !errors.Is(err, sdk.ErrMirrorNotFound) {
		t.Errorf("GetMirror after delete: %v, want ErrMirrorNotFound", err)
	}
	if err := c.DeleteMirror(ctx, "from-hz"); !errors.Is(err, sdk.ErrMirrorNotFound) {
		t.Errorf("DeleteMirror again: %v, want ErrMirrorNotFound", err)
	}
}
