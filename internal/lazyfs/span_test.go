package lazyfs

import (
	"slices"
	"testing"
)

func TestAddSpanKeepsSpansSortedAndDisjoint(t *testing.T) {
	for _, c := range []struct {
		add  []span
		want []span
	}{
		{[]span{{0, 10}, {10, 20}}, []span{{0, 20}}},
		{[]span{{0, 10}, {20, 30}}, []span{{0, 10}, {20, 30}}},
		{[]span{{20, 30}, {0, 10}}, []span{{0, 10}, {20, 30}}},
		{[]span{{0, 10}, {20, 30}, {40, 50}, {5, 45}}, []span{{0, 50}}},
		{[]span{{0, 10}, {20, 30}, {40, 50}, {12, 18}}, []span{{0, 10}, {12, 18}, {20, 30}, {40, 50}}},
		{[]span{{0, 10}, {20, 30}, {10, 20}}, []span{{0, 30}}},
		{[]span{{0, 10}, {20, 30}, {2, 3}}, []span{{0, 10}, {20, 30}}},
		{[]span{{20, 30}, {0, 10}, {25, 40}}, []span{{0, 10}, {20, 40}}},
	} {
		var got []span
		for _, s := range c.add {
			got = addSpan(got, s)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("adding %v: %v, want %v", c.add, got, c.want)
		}
	}
}
