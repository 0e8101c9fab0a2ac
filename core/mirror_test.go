package core_test

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tidemq/tidemq/core"
)

var mirrorSrc = core.MirrorSource{URL: "http://hz.example:8080", Topic: "orders", Token: "tok"}

func (e *env) putMirror(name string, cfg core.MirrorConfig) core.MirrorInfo {
	e.t.Helper()
	info, _, err := e.b.PutMirror(e.t.Context(), name, cfg)
	if err != nil {
		e.t.Fatalf("PutMirror %s: %v", name, err)
	}
	return info
}

// copyOf is a mirrored copy of source offset off of queue q.
func copyOf(q uint32, off uint64) core.MirrorCopy {
	id := fmt.Sprintf("src-%d-%d", q, off)
	return core.MirrorCopy{SourceQueue: q, SourceOff: off, Msg: &core.Message{Body: []byte(id), DedupKey: id,
		Properties: map[string]string{core.PropMirrorSourceMessageID: id, core.PropMirrorPath: "hz"}}}
}

// storedCopies counts the copies on a topic by source id.
func (e *env) storedCopies(topic string) map[string]int {
	e.t.Helper()
	e.subscribe(topic, "count", core.SubscriptionConfig{})
	out := map[string]int{}
	for _, d := range e.drain(topic, "count", core.PullRequest{MaxMessages: 1000}) {
		out[d.Message.Properties[core.PropMirrorSourceMessageID]]++
	}
	if err := e.b.DeleteSubscription(e.t.Context(), topic, "count"); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func TestMirrorDefinitionsSurviveRestart(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	ctx := t.Context()
	e.putTopic("copies", 2)
	maxLag := int64(5)
	info := e.putMirror("from-hz", core.MirrorConfig{Source: mirrorSrc, Topic: "copies", Alerts: &core.AlertConfig{MaxLag: &maxLag}})
	if info.Filter != "*" || info.StartFrom != "earliest" || info.State != core.MirrorRunning || info.Source.Token != "" || info.Copied != 0 {
		t.Fatalf("created %+v", info)
	}
	if n, err := e.b.SendMirrored(ctx, "from-hz", []core.MirrorCopy{copyOf(0, 0), copyOf(0, 2), copyOf(1, 0)}); err != nil || n != 3 {
		t.Fatalf("SendMirrored: %d, %v", n, err)
	}
	if _, created, err := e.b.PutMirror(ctx, "from-hz", core.MirrorConfig{Source: mirrorSrc, Topic: "copies", Filter: "a || b", Paused: true, StartFrom: "latest"}); err != nil || created {
		t.Fatalf("update: created %v, %v", created, err)
	}
	e.putMirror("other", core.MirrorConfig{Source: mirrorSrc, Topic: "copies"})
	e.restart()
	got, err := e.b.GetMirror("from-hz")
	if err != nil {
		t.Fatal(err)
	}
	// startFrom stays what the mirror was created with: the source
	// subscription is made once.
	if got.Filter != "a || b" || got.StartFrom != "earliest" || got.State != core.MirrorPaused || got.Copied != 3 ||
		!got.LastCopiedAt.Equal(clk.Now().Truncate(time.Millisecond)) || got.Alerts != nil || got.Topic != "copies" || got.Source.URL != mirrorSrc.URL {
		t.Fatalf("after restart %+v", got)
	}
	defs := e.b.MirrorDefinitions()
	if len(defs) != 2 || defs[0].Name != "from-hz" || defs[0].Source.Token != "tok" {
		t.Fatalf("definitions %+v", defs)
	}
	for _, c := range []struct {
		q    uint32
		off  uint64
		want bool
	}{{0, 0, true}, {0, 1, false}, {0, 2, true}, {1, 0, true}, {1, 1, false}} {
		if got := e.b.MirrorStored("from-hz", c.q, c.off); got != c.want {
			t.Errorf("MirrorStored(%d, %d) = %v after restart", c.q, c.off, got)
		}
	}
	if e.b.MirrorStored("other", 0, 0) {
		t.Error("another mirror's skip record holds from-hz's offsets")
	}

	// A new source starts the record afresh.
	e.putMirror("from-hz", core.MirrorConfig{Source: core.MirrorSource{URL: "http://sg.example", Topic: "orders"}, Topic: "copies"})
	if e.b.MirrorStored("from-hz", 0, 0) {
		t.Error("a mirror given another source still skips the old source's offsets")
	}
	if got, _ := e.b.GetMirror("from-hz"); got.Copied != 0 || got.StartFrom != "earliest" {
		t.Errorf("after a new source %+v", got)
	}

	if err := e.b.DeleteMirror(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	e.restart()
	wantErr(t, func() error { _, err := e.b.GetMirror("other"); return err }(), core.ErrMirrorNotFound)
	wantErr(t, e.b.DeleteMirror(ctx, "other"), core.ErrMirrorNotFound)
	if l := e.b.ListMirrors(); len(l) != 1 || l[0].Name != "from-hz" {
		t.Fatalf("list %+v", l)
	}
	if e.b.MirrorStored("from-hz", 0, 0) {
		t.Error("the reset skip record came back after a restart")
	}
	_, err = e.b.SendMirrored(ctx, "other", []core.MirrorCopy{copyOf(0, 0)})
	wantErr(t, err, core.ErrMirrorNotFound)
}

func TestMirrorConfigRefused(t *testing.T) {
	e := newEnv(t, core.Options{})
	ctx := t.Context()
	e.putTopic("copies", 1)
	neg := int64(-1)
	zero := int64(0)
	for _, c := range []struct {
		name  string
		cfg   core.MirrorConfig
		field string
		err   error
	}{
		{"ok", core.MirrorConfig{Source: core.MirrorSource{URL: "ftp://x", Topic: "o"}, Topic: "copies"}, "/source/url", nil},
		{"ok", core.MirrorConfig{Source: core.MirrorSource{URL: "http://", Topic: "o"}, Topic: "copies"}, "/source/url", nil},
		{"ok", core.MirrorConfig{Source: core.MirrorSource{URL: "http://x", Topic: "o", Token: "a\nb"}, Topic: "copies"}, "/source/token", nil},
		{"ok", core.MirrorConfig{Source: core.MirrorSource{URL: "http://x", Topic: "bad topic"}, Topic: "copies"}, "", core.ErrInvalidName},
		{"ok", core.MirrorConfig{Source: mirrorSrc, Topic: ""}, "", core.ErrInvalidName},
		{"ok", core.MirrorConfig{Source: mirrorSrc, Topic: "copies", Filter: "a ||"}, "", core.ErrInvalidFilter},
		{"ok", core.MirrorConfig{Source: mirrorSrc, Topic: "copies", StartFrom: "yesterday"}, "/startFrom", nil},
		{"ok", core.MirrorConfig{Source: mirrorSrc, Topic: "copies", Alerts: &core.AlertConfig{MaxLag: &neg}}, "/alerts/maxLag", nil},
		{"ok", core.MirrorConfig{Source: mirrorSrc, Topic: "copies", Alerts: &core.AlertConfig{MaxDLQ: &zero}}, "/alerts/maxDlq", nil},
		{"ok", core.MirrorConfig{Source: mirrorSrc, Topic: "missing"}, "", core.ErrTopicNotFound},
		{"bad name", core.MirrorConfig{Source: mirrorSrc, Topic: "copies"}, "", core.ErrInvalidName},
	} {
		_, _, err := e.b.PutMirror(ctx, c.name, c.cfg)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("%+v: err %v, want %v", c.cfg, err, c.err)
			}
			continue
		}
		wantValidation(t, err, c.field, -1)
	}
	if l := e.b.ListMirrors(); len(l) != 0 {
		t.Fatalf("refused configs made mirrors: %+v", l)
	}
}

// Copies whose source offsets are recorded are not stored again: repeats
// in a batch, after a restart, and after the dedup window has forgotten
// their dedup keys. Offsets recorded out of order fill the watermark's
// gaps, so the record stays small.
func TestMirrorSkipsWhatItStored(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now, DedupWindow: time.Minute})
	ctx := t.Context()
	e.putTopic("copies", 2)
	e.putMirror("m", core.MirrorConfig{Source: mirrorSrc, Topic: "copies"})
	rng := rand.New(rand.NewPCG(1, 2))
	offs := rng.Perm(100)
	total := 0
	for i := 0; i < len(offs); i += 10 {
		var cs []core.MirrorCopy
		for _, o := range offs[i : i+10] {
			cs = append(cs, copyOf(0, uint64(o)))
		}
		cs = append(cs, cs[0]) // a repeat in the batch
		cs[1].Msg = nil        // a loop: recorded, not stored
		n, err := e.b.SendMirrored(ctx, "m", cs)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if total != 90 {
		t.Fatalf("stored %d copies, want 90", total)
	}
	snap, err := e.store.Load()
	if err != nil {
		t.Fatal(err)
	}
	if p := snap.MirrorProgress["m"]; len(p) != 1 || p[0].Watermark != 100 || len(p[0].Stored) != 0 || p[0].Copied != 90 {
		t.Fatalf("skip record %+v, want watermark 100 and nothing above", p)
	}
	e.restart()
	clk.Advance(2 * time.Minute) // past the dedup window
	var again []core.MirrorCopy
	for o := range 100 {
		again = append(again, copyOf(0, uint64(o)))
	}
	again = append(again, copyOf(0, 100), copyOf(1, 0))
	n, err := e.b.SendMirrored(ctx, "m", again)
	if err != nil || n != 2 {
		t.Fatalf("after a restart and the dedup window: stored %d, %v; want the 2 new ones", n, err)
	}
	copies := e.storedCopies("copies")
	if len(copies) != 92 {
		t.Errorf("%d distinct copies, want 92", len(copies))
	}
	for id, k := range copies {
		if k != 1 {
			t.Errorf("%s stored %d times", id, k)
		}
	}
	if info, _ := e.b.GetMirror("m"); info.Copied != 92 {
		t.Errorf("copied = %d, want 92", info.Copied)
	}

	// The source's acked offsets raise the watermark over the gaps its
	// filter leaves.
	if _, err := e.b.SendMirrored(ctx, "m", []core.MirrorCopy{copyOf(1, 5)}); err != nil {
		t.Fatal(err)
	}
	if err := e.b.RaiseMirrorWatermarks(ctx, "m", map[uint32]uint64{1: 4}); err != nil {
		t.Fatal(err)
	}
	e.restart()
	for off, want := range map[uint64]bool{3: true, 4: false, 5: true, 6: false} {
		if got := e.b.MirrorStored("m", 1, off); got != want {
			t.Errorf("MirrorStored(1, %d) = %v after the raise, want %v", off, got, want)
		}
	}
}

// However a crash cuts the mirror's writes, copies and their record are
// there together: every source offset recorded has its copy, every copy
// its record, and every acknowledged batch is there.
func TestMirrorCopiesAndRecordSurviveCrashTogether(t *testing.T) {
	fs := vfs.NewCrashableMem()
	e := newEnvOn(t, fs, core.Options{})
	e.putTopic("copies", 4)
	e.putMirror("m", core.MirrorConfig{Source: mirrorSrc, Topic: "copies"})

	type checkpoint struct {
		fs    vfs.FS
		acked map[string]bool
	}
	var (
		mu          sync.Mutex
		acked       = map[string]bool{}
		checkpoints []checkpoint
		wg          sync.WaitGroup
	)
	for q := range uint32(2) {
		wg.Go(func() {
			for off := uint64(0); off < 300; off += 3 {
				// Out of order within a batch, as across orderly keys.
				cs := []core.MirrorCopy{copyOf(q, off+2), copyOf(q, off), copyOf(q, off+1)}
				if _, err := e.b.SendMirrored(t.Context(), "m", cs); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, c := range cs {
					acked[string(c.Msg.Body)] = true
				}
				if len(acked)%150 == 0 {
					checkpoints = append(checkpoints, checkpoint{fs.CrashClone(vfs.CrashCloneCfg{}), maps.Clone(acked)})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(checkpoints) < 2 {
		t.Fatalf("%d checkpoints", len(checkpoints))
	}
	for i, cp := range checkpoints {
		c := newEnvOn(t, cp.fs, core.Options{})
		copies := c.storedCopies("copies")
		for id := range cp.acked {
			if copies[id] != 1 {
				t.Errorf("checkpoint %d: acknowledged copy %s stored %d times", i, id, copies[id])
			}
		}
		for q := range uint32(2) {
			for off := range uint64(300) {
				id := fmt.Sprintf("src-%d-%d", q, off)
				if rec := c.b.MirrorStored("m", q, off); rec != (copies[id] == 1) {
					t.Errorf("checkpoint %d: %s recorded %v, copies %d", i, id, rec, copies[id])
				}
			}
		}
		c.close()
	}
}

func TestMirrorStatusReported(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("copies", 1)
	e.putMirror("m", core.MirrorConfig{Source: mirrorSrc, Topic: "copies"})
	e.b.ReportMirror("m", core.MirrorStatus{Failing: true, LastError: "source down", Lag: 7})
	e.b.ReportMirror("nobody", core.MirrorStatus{Failing: true})
	got, err := e.b.GetMirror("m")
	if err != nil || got.State != core.MirrorFailing || got.LastError != "source down" || got.Lag != 7 {
		t.Fatalf("%+v, %v", got, err)
	}
	e.b.ReportMirror("m", core.MirrorStatus{Lag: 0, LastError: "source down"})
	if got, _ := e.b.GetMirror("m"); got.State != core.MirrorRunning || got.Lag != 0 {
		t.Fatalf("recovered: %+v", got)
	}
}

type alertRecorder struct {
	mu     sync.Mutex
	alerts []core.Alert
}

func (r *alertRecorder) Notify(a core.Alert) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.alerts = append(r.alerts, a)
}

func (r *alertRecorder) seen() []core.Alert {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.alerts)
}

// A mirror's lag alerts like a subscription's, and its lag, copies and
// state are metrics.
func TestMirrorLagAlertsAndMetrics(t *testing.T) {
	rec := &alertRecorder{}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := newEnv(t, core.Options{Notifier: rec, AlertInterval: 5 * time.Millisecond, MeterProvider: mp})
	e.putTopic("copies", 1)
	maxLag := int64(5)
	e.putMirror("m", core.MirrorConfig{Source: mirrorSrc, Topic: "copies", Alerts: &core.AlertConfig{MaxLag: &maxLag, WebhookURL: "http://hook"}})
	if _, err := e.b.SendMirrored(t.Context(), "m", []core.MirrorCopy{copyOf(0, 0), copyOf(0, 1)}); err != nil {
		t.Fatal(err)
	}
	waitAlerts := func(n int) []core.Alert {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for len(rec.seen()) < n {
			if time.Now().After(deadline) {
				t.Fatalf("alerts %+v, want %d", rec.seen(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return rec.seen()
	}
	e.b.ReportMirror("m", core.MirrorStatus{Lag: 9, Failing: true, LastError: "x"})
	a := waitAlerts(1)[0]
	if a.Status != "firing" || a.Alert != "lag" || a.Mirror != "m" || a.Group != "mirror.m" || a.Topic != "copies" || a.Value != 9 || a.Max != 5 || a.WebhookURL != "http://hook" {
		t.Fatalf("alert %+v", a)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if v, _ := p.Attributes.Value("mirror"); v.AsString() == "m" {
						got[m.Name] = p.Value
					}
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if v, _ := p.Attributes.Value("mirror"); v.AsString() == "m" {
						got[m.Name] = p.Value
					}
				}
			}
		}
	}
	if want := map[string]int64{"tidemq.mirror.lag": 9, "tidemq.mirror.copied": 2, "tidemq.mirror.failing": 1}; !maps.Equal(got, want) {
		t.Errorf("mirror metrics %v, want %v", got, want)
	}

	e.b.ReportMirror("m", core.MirrorStatus{Lag: 5})
	if a := waitAlerts(2)[1]; a.Status != "resolved" || a.Value != 5 {
		t.Fatalf("alert %+v", a)
	}
}

// A copy's send span is a child of its source message's trace (the
// source's traceparent), and its deliveries here follow in that trace.
func TestMirrorCopyJoinsSourceTrace(t *testing.T) {
	const srcTrace, srcSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, tracer := range tracers {
		t.Run(tracer, func(t *testing.T) {
			b, ended := tracedBroker(t, tracer)
			ctx := t.Context()
			if _, _, err := b.PutMirror(ctx, "m", core.MirrorConfig{Source: mirrorSrc, Topic: "copies"}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := b.PutSubscription(ctx, "copies", "g", core.SubscriptionConfig{}); err != nil {
				t.Fatal(err)
			}
			cp := copyOf(0, 0)
			cp.Msg.Traceparent = "00-" + srcTrace + "-" + srcSpan + "-01"
			if _, err := b.SendMirrored(ctx, "m", []core.MirrorCopy{cp}); err != nil {
				t.Fatal(err)
			}
			got, err := b.Pull(ctx, "copies", "g", core.PullRequest{MaxMessages: 1})
			if err != nil || len(got) != 1 {
				t.Fatalf("pull: %d, %v", len(got), err)
			}
			if tp := got[0].Traceparent; len(tp) != 55 || tp[3:35] != srcTrace {
				t.Errorf("the pulled copy's traceparent %q is not in the source's trace", tp)
			}
			found := false
			for _, s := range ended() {
				if s.Name() == core.SpanSend && s.SpanContext().TraceID().String() == srcTrace {
					found = true
					if p := s.Parent().SpanID().String(); p != srcSpan {
						t.Errorf("the copy's send span has parent %s, want the source's %s", p, srcSpan)
					}
				}
			}
			if !found {
				t.Error("no send span in the source's trace")
			}
		})
	}
}

// Copies sent for a paused mirror are refused, and record nothing; once
// resumed, the same copies are stored.
func TestMirrorPausedRefusesCopies(t *testing.T) {
	e := newEnv(t, core.Options{})
	ctx := t.Context()
	e.putTopic("copies", 1)
	e.putMirror("m", core.MirrorConfig{Source: mirrorSrc, Topic: "copies", Paused: true})
	_, err := e.b.SendMirrored(ctx, "m", []core.MirrorCopy{copyOf(0, 0)})
	wantErr(t, err, core.ErrMirrorPaused)
	if e.b.MirrorStored("m", 0, 0) {
		t.Error("a refused copy's source offset is recorded")
	}
	e.putMirror("m", core.MirrorConfig{Source: mirrorSrc, Topic: "copies"})
	if n, err := e.b.SendMirrored(ctx, "m", []core.MirrorCopy{copyOf(0, 0)}); err != nil || n != 1 {
		t.Fatalf("resumed: stored %d, %v", n, err)
	}
	if got := e.storedCopies("copies"); len(got) != 1 {
		t.Errorf("copies %v, want the one", got)
	}
}
