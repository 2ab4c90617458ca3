package local

import "math/bits"

// entry is a run of n units admitted at the same instant.
type entry struct {
	at int64 // ns since the limiter's base
	n  int64
}

// window is an exact sliding-window log: the units admitted in the last
// window, oldest first, and their sum. Entries live in e[head:]; the slice is
// reused, so a counter in steady state does not allocate. It holds at most
// the rule's limit entries (each entry carries at least one unit).
type window struct {
	e    []entry
	head int
	sum  int64
}

// expire drops the units admitted at or before cut: a unit admitted at t
// counts while now-t < window, i.e. while t > now-window.
func (w *window) expire(cut int64) {
	for w.head < len(w.e) && w.e[w.head].at <= cut {
		w.sum -= w.e[w.head].n
		w.head++
	}
	if w.head == len(w.e) {
		w.e = w.e[:0]
		w.head = 0
	}
}

func (w *window) add(at, n int64) {
	w.sum += n
	if last := len(w.e) - 1; last >= w.head && w.e[last].at == at {
		w.e[last].n += n
		return
	}
	if w.head > 0 && len(w.e) == cap(w.e) {
		k := copy(w.e, w.e[w.head:])
		w.e = w.e[:k]
		w.head = 0
	}
	w.e = append(w.e, entry{at, n})
}

// unitAt returns when the k-th oldest unit (0-based) still in the window was
// admitted; k must be below sum.
func (w *window) unitAt(k int64) int64 {
	for i := w.head; i < len(w.e); i++ {
		if k < w.e[i].n {
			return w.e[i].at
		}
		k -= w.e[i].n
	}
	return 0
}

// freeAfter returns how long after now the window has freed need units
// (need >= 1): the need-th oldest unit leaves it window ns after it came.
// When fewer than need units are held, waiting cannot help by itself and
// the answer is one whole window.
func (w *window) freeAfter(need, now, span int64) int64 {
	if need > w.sum || need <= 0 {
		return span
	}
	return w.unitAt(need-1) + span - now
}

// mulDiv returns a*b/c for non-negative a, b and positive c without
// overflowing in the product; the result saturates at MaxInt64.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return 1<<63 - 1
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(q)
}
