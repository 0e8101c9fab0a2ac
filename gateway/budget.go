package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
)

// DefaultBodyBudgetBytes is the default Options.BodyBudgetBytes: three 16
// MiB requests at once. With their decoded messages and store batches that
// is ~90 MB live, which the broker's collector (internal/gctune) keeps
// under a 224 MiB heap: a flooded broker stays under 512 MiB of RSS
// (docs/ARCHITECTURE.md, "Memory").
const DefaultBodyBudgetBytes = 48 << 20

// bodyBudget bounds the request-body bytes held by requests in flight, so
// that a flood of large sends is refused before its bodies are read
// instead of growing the heap (each body is buffered whole).
type bodyBudget struct {
	limit int64
	used  atomic.Int64
}

// reservation is one request's share of the budget; the zero value with a
// budget set holds nothing.
type reservation struct {
	b    *bodyBudget
	held int64
}

// grow reserves n more bytes. It is refused when the budget would go past
// its limit, unless this request would then hold all of it: a request
// alone is always admitted, so a budget smaller than one body still lets
// bodies through one at a time. Two requests that reserve at the same
// instant may both be refused where one would have fit; each retries.
func (r *reservation) grow(n int64) bool {
	u := r.b.used.Add(n)
	if u > r.b.limit && u != r.held+n {
		r.b.used.Add(-n)
		return false
	}
	r.held += n
	return true
}

// release gives back what the request holds.
func (r *reservation) release() {
	if r.held != 0 {
		r.b.used.Add(-r.held)
		r.held = 0
	}
}

// errBudget is a refusal for want of budget; the caller retries later.
func errBudget(b *bodyBudget) error {
	return &httpError{kind: kindTooManyRequests, entry: -1,
		detail: fmt.Sprintf("the request bodies being read take the server's budget of %d bytes; retry later", b.limit)}
}

// minBodyGrowth is the smallest step a body buffer of unknown length
// grows by, so that a chunked body is not reserved 512 bytes at a time.
const minBodyGrowth = 64 << 10

// readReserved reads src to its end into one buffer of at most limit
// bytes, reserving every growth of the buffer before it is made. size is
// what is already reserved (the Content-Length), the buffer's first
// capacity; a body that fills it exactly costs no growth, as the last read
// returns io.EOF or a small probe does.
func readReserved(src io.Reader, size, limit int64, res *reservation) ([]byte, error) {
	buf := newBodyBuf(size)
	var probe []byte // made on first use: a body whose last read brings io.EOF needs none
	for {
		if len(buf) < cap(buf) {
			n, err := src.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err != nil {
				return readEnd(buf, err, limit)
			}
			continue
		}
		if probe == nil {
			probe = make([]byte, 512)
		}
		n, err := src.Read(probe)
		if n > 0 {
			need := int64(len(buf) + n)
			if need > limit {
				return nil, tooLarge(limit)
			}
			newCap := min(max(2*int64(cap(buf)), need, minBodyGrowth), limit)
			if !res.grow(newCap - int64(cap(buf))) {
				return nil, errBudget(res.b)
			}
			grown := make([]byte, len(buf), newCap)
			copy(grown, buf)
			buf = append(grown, probe[:n]...)
		}
		if err != nil {
			return readEnd(buf, err, limit)
		}
	}
}

// bodyBufs are body buffers given back by the routes whose handlers hold
// nothing of the body once they return (recycleBody). A batch send's body
// (~140 KB for 100 × 1 KiB) was the largest allocation left on its path:
// with 10,000 long polls parked, where each collection scans their 20,000
// stacks, pooled bodies saved ~12% of a batch send's CPU (docs/bench).
var bodyBufs sync.Pool

// maxPooledBody is the largest buffer kept: a flood's bodies are not.
const maxPooledBody = 1 << 20

// newBodyBuf is an empty buffer for a body of size bytes (0: unknown, the
// buffer grows as it is read), pooled when one large enough is at hand.
// A pooled buffer's spare capacity is not read into: the body ends at its
// Content-Length.
func newBodyBuf(size int64) []byte {
	if size > 0 && size <= maxPooledBody {
		if p, _ := bodyBufs.Get().(*[]byte); p != nil && int64(cap(*p)) >= size {
			return (*p)[:0]
		}
	}
	return make([]byte, 0, size)
}

// recycleBody gives body's buffer to later requests; nothing may read or
// hold it afterwards.
func recycleBody(body []byte) {
	if c := cap(body); c > 0 && c <= maxPooledBody {
		body = body[:0]
		bodyBufs.Put(&body)
	}
}

// readEnd is the result of a read that ended with err.
func readEnd(buf []byte, err error, limit int64) ([]byte, error) {
	if err == io.EOF {
		return buf, nil
	}
	if _, over := errors.AsType[*http.MaxBytesError](err); over {
		return nil, tooLarge(limit)
	}
	return nil, badRequest("", "reading the request body: %v", err)
}

func tooLarge(limit int64) error {
	return newHTTPError(http.StatusRequestEntityTooLarge, "request_too_large", "Request too large", "the request body is over %d bytes", limit)
}
