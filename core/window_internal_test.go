package core

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func windowOf(offsets ...uint64) *window {
	w := &window{}
	for _, o := range offsets {
		w.set(o)
	}
	return w
}

func TestWindowSetHasClear(t *testing.T) {
	w := windowOf(5, 63, 64, 127, 128, 1000)
	for _, o := range []uint64{5, 63, 64, 127, 128, 1000} {
		if !w.has(o) {
			t.Errorf("has(%d) = false after set", o)
		}
	}
	for _, o := range []uint64{0, 4, 6, 62, 65, 126, 129, 999, 1001, 5000} {
		if w.has(o) {
			t.Errorf("has(%d) = true, never set", o)
		}
	}
	w.clear(64)
	w.clear(1000)
	w.clear(7)     // not set
	w.clear(99999) // beyond the words
	if w.has(64) || w.has(1000) {
		t.Error("clear left the bit set")
	}
	if !w.has(63) || !w.has(127) {
		t.Error("clear touched a neighbour")
	}
}

func TestWindowBaseIsWordAligned(t *testing.T) {
	w := windowOf(130)
	if w.base != 128 {
		t.Errorf("base = %d after set(130), want 128", w.base)
	}
	if o, ok := w.first(0); !ok || o != 130 {
		t.Errorf("first(0) = %d %v, want 130", o, ok)
	}
	w.clear(1) // below base: ignored
	if w.has(1) {
		t.Error("has(1) below base")
	}
}

func TestWindowFirst(t *testing.T) {
	w := windowOf(5, 63, 64, 200)
	for _, tc := range []struct {
		from uint64
		want uint64
		ok   bool
	}{
		{0, 5, true}, {5, 5, true}, {6, 63, true}, {63, 63, true}, {64, 64, true},
		{65, 200, true}, {199, 200, true}, {200, 200, true}, {201, 0, false}, {1 << 40, 0, false},
	} {
		got, ok := w.first(tc.from)
		if got != tc.want || ok != tc.ok {
			t.Errorf("first(%d) = %d %v, want %d %v", tc.from, got, ok, tc.want, tc.ok)
		}
	}
	w.clear(64)
	if got, ok := w.first(64); got != 200 || !ok {
		t.Errorf("first(64) after clear(64) = %d %v, want 200 (across an empty word)", got, ok)
	}
	if _, ok := (&window{}).first(0); ok {
		t.Error("first on an empty window found something")
	}
}

func TestWindowTrim(t *testing.T) {
	w := windowOf(10, 70, 130, 300)
	w.clear(10)
	w.trim(64)
	if w.base != 64 {
		t.Errorf("base = %d after trim(64), want 64", w.base)
	}
	if got, ok := w.first(0); got != 70 || !ok {
		t.Errorf("first(0) after trim(64) = %d %v, want 70", got, ok)
	}
	w.trim(65) // inside a word: nothing whole below it to drop
	if w.base != 64 || !w.has(70) {
		t.Errorf("trim(65) dropped the word holding 70: base %d", w.base)
	}
	w.clear(70)
	w.trim(130)
	if w.base != 128 || !w.has(130) || !w.has(300) || w.has(70) {
		t.Errorf("after trim(130): base %d, has(130)=%v has(300)=%v", w.base, w.has(130), w.has(300))
	}
	w.trim(10) // below base: nothing
	if w.base != 128 {
		t.Errorf("trim below base moved it to %d", w.base)
	}
	w.clear(130)
	w.clear(300)
	w.trim(400)
	if len(w.words) != 0 || w.base != 384 {
		t.Errorf("trim past everything: %d words, base %d; want 0 and 384", len(w.words), w.base)
	}
	if _, ok := w.first(0); ok {
		t.Error("first found an offset in an emptied window")
	}
	// It keeps working after being emptied.
	w.set(390)
	w.set(520)
	if got, ok := w.first(0); got != 390 || !ok || !w.has(520) {
		t.Errorf("after re-set: first(0) = %d %v, has(520)=%v", got, ok, w.has(520))
	}
}

// The broker's use: offsets set in increasing order, cleared in any order,
// trimmed at the lowest outstanding offset. A map is the model.
func TestWindowAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := &window{}
	model := map[uint64]bool{}
	var next, acked uint64
	for step := range 4000 {
		switch op := rng.IntN(20); {
		case op < 9:
			next += uint64(1 + rng.IntN(3))
			if rng.IntN(50) == 0 {
				next += uint64(rng.IntN(500)) // a long filtered run
			}
			w.set(next)
			model[next] = true
		case op < 18 && len(model) > 0:
			keys := make([]uint64, 0, len(model))
			for k := range model {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			k := keys[rng.IntN(len(keys))]
			w.clear(k)
			delete(model, k)
		default:
			// The watermark: lowest outstanding, or past everything.
			wm := next + 1
			if o, ok := w.first(acked); ok {
				wm = o
			}
			if wm > acked {
				acked = wm
				w.trim(wm)
				if w.base != wm&^63 {
					t.Fatalf("step %d: base %d after trim(%d), want %d", step, w.base, wm, wm&^63)
				}
			}
		}
		from := acked + uint64(rng.IntN(100))
		want, wantOK := uint64(0), false
		for k := range model {
			if k >= from && (!wantOK || k < want) {
				want, wantOK = k, true
			}
		}
		if got, ok := w.first(from); got != want || ok != wantOK {
			t.Fatalf("step %d: first(%d) = %d %v, model says %d %v", step, from, got, ok, want, wantOK)
		}
		for k := range model {
			if !w.has(k) {
				t.Fatalf("step %d: has(%d) = false, model has it", step, k)
			}
		}
	}
}
