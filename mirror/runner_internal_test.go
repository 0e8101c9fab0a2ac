package mirror

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/sdk"
)

func TestCopyOfKeepsFieldsAndExtendsThePath(t *testing.T) {
	c := &copier{r: &Runner{opts: Options{Region: "sg"}}, sourceRegion: "hz"}
	born := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)
	for _, tc := range []struct {
		path, wantPath string
		loops          bool
	}{
		{"", "hz", false},
		{"us", "us,hz", false},
		{"us,sg", "", true},
		{"sg", "", true},
		{"sgp,xsg", "sgp,xsg,hz", false},
	} {
		m := &sdk.PulledMessage{MessageID: "ID1", QueueID: 3, Offset: 9, Body: "AAEC", BodyEncoding: sdk.EncodingBase64, Tag: "TagA",
			Keys: []string{"k1", "k2"}, Properties: map[string]string{"color": "blue"}, ShardingKey: "s", BornAt: born,
			StoredAt: born.Add(time.Second), ProducerGroup: "shop", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
		if tc.path != "" {
			m.Properties[core.PropMirrorPath] = tc.path
		}
		if got := c.loops(m); got != tc.loops {
			t.Errorf("path %q: loops = %v, want %v", tc.path, got, tc.loops)
		}
		if tc.loops {
			continue
		}
		cp, err := c.copyOf(m)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"color": "blue", core.PropMirrorPath: tc.wantPath, core.PropMirrorSourceRegion: "hz", core.PropMirrorSourceMessageID: "ID1"}
		if !maps.Equal(cp.Properties, want) {
			t.Errorf("path %q: properties %v, want %v", tc.path, cp.Properties, want)
		}
		if string(cp.Body) != "\x00\x01\x02" || !cp.BodyBase64 || cp.Tag != "TagA" || !slices.Equal(cp.Keys, m.Keys) || cp.ShardingKey != "s" ||
			cp.BornAtMs != born.UnixMilli() || cp.ProducerGroup != "shop" || cp.Traceparent != m.Traceparent || cp.DedupKey != "ID1" {
			t.Errorf("copy %+v of %+v", cp, m)
		}
		if m.Properties["color"] != "blue" || len(m.Properties) > 2 {
			t.Errorf("the source message's properties changed: %v", m.Properties)
		}
	}
	// The source region alone makes a loop when it is ours.
	same := &copier{r: &Runner{opts: Options{Region: "hz"}}, sourceRegion: "hz"}
	if !same.loops(&sdk.PulledMessage{}) {
		t.Error("a message from this region is not a loop")
	}
}
