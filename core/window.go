package core

import "math/bits"

// window is a bitset over offsets starting at base: a set bit marks an
// offset that is still outstanding (leased, or waiting to be delivered
// again). It slides forward as the watermark passes whole words.
type window struct {
	base  uint64 // multiple of 64
	words []uint64
}

func (w *window) set(o uint64) {
	if len(w.words) == 0 {
		w.base = o &^ 63
	}
	i := (o - w.base) / 64
	for uint64(len(w.words)) <= i {
		w.words = append(w.words, 0)
	}
	w.words[i] |= 1 << (o % 64)
}

func (w *window) clear(o uint64) {
	if o < w.base {
		return
	}
	if i := (o - w.base) / 64; i < uint64(len(w.words)) {
		w.words[i] &^= 1 << (o % 64)
	}
}

func (w *window) has(o uint64) bool {
	if o < w.base {
		return false
	}
	i := (o - w.base) / 64
	return i < uint64(len(w.words)) && w.words[i]&(1<<(o%64)) != 0
}

// first returns the lowest set offset at or above from, if any.
func (w *window) first(from uint64) (uint64, bool) {
	if from < w.base {
		from = w.base
	}
	i := (from - w.base) / 64
	if i >= uint64(len(w.words)) {
		return 0, false
	}
	word := w.words[i] &^ (1<<(from%64) - 1)
	for {
		if word != 0 {
			return w.base + i*64 + uint64(bits.TrailingZeros64(word)), true
		}
		i++
		if i >= uint64(len(w.words)) {
			return 0, false
		}
		word = w.words[i]
	}
}

// trim drops the words wholly below o.
func (w *window) trim(o uint64) {
	if o <= w.base {
		return
	}
	n := (o - w.base) / 64
	if n >= uint64(len(w.words)) {
		w.words = w.words[:0]
		w.base = o &^ 63
		return
	}
	w.words = append(w.words[:0], w.words[n:]...)
	w.base += n * 64
}
