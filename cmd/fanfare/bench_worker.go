package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/fanfare-im/fanfare/client"
	"github.com/fanfare-im/fanfare/gateway/auth"
)

// The load generator's receivers run in workers: in-process when they fit
// one process's file descriptors, else in child processes (`fanfare bench
// worker`, not listed in help). Parent and worker speak JSON lines: the
// parent writes a workerSpec, the worker answers workerReady once its
// connections are up, the parent writes workerCmd{Op: "go"} when sending
// starts and workerCmd{Op: "stop"} with the acked seqs when it ends, and
// the worker answers with workerResult and exits.

// workerSpec says which members a worker connects.
type workerSpec struct {
	WS     string `json:"ws"`
	GID    int64  `json:"gid"`
	Prefix string `json:"prefix"` // member uid = Prefix + index
	Lo     int    `json:"lo"`     // member indexes [Lo, Hi)
	Hi     int    `json:"hi"`
	Secret string `json:"secret"`
	// Addrs are the source addresses; member index i binds to
	// Addrs[i/PerAddr]. Empty means no binding.
	Addrs   []string `json:"addrs,omitempty"`
	PerAddr int      `json:"per_addr"`
	// Seq0 is the group's last_seq before the run: receivers track the
	// group from there, so nothing sent during the run can be missed.
	Seq0     int64         `json:"seq0"`
	Dials    int           `json:"dials"` // concurrent dials
	ReadBuf  int           `json:"read_buf"`
	Drain    time.Duration `json:"drain"`
	Deadline time.Duration `json:"connect_deadline"`
	// Receivers is "sdk" (client.Conn per member, the default) or "lean"
	// (see bench_lean.go); Loops is the lean receivers' event loops.
	Receivers string `json:"receivers,omitempty"`
	Loops     int    `json:"loops,omitempty"`
	// Peer is the server's protocol for kernel receivers (peerFanfare,
	// peerCentrifugo; see bench_kernel.go) and Channel the
	// Centrifugo channel they subscribe to. With kernel receivers Secret
	// signs Centrifugo's tokens too, and seqs are the publisher's "n".
	Peer    string `json:"peer,omitempty"`
	Channel string `json:"channel,omitempty"`
	// Seqs (kernel receivers of fanfare) makes the ledger count the
	// server's seqs of GID from Seq0 instead of the publisher's "n", and
	// repair what is missing by pull: a gap in the pushed seqs, a resync,
	// an L2 summary (bench cluster).
	Seqs bool `json:"seqs,omitempty"`
	// GCPercent, when positive, is the worker's GOGC (else 400 unless
	// GOGC is set): bench cluster trades the receivers' GC time for
	// memory, which bounds the online count of one machine.
	GCPercent int `json:"gc_percent,omitempty"`
	// GoMaxProcs, when positive, is the worker's GOMAXPROCS.
	GoMaxProcs int `json:"gomaxprocs,omitempty"`
}

type workerReady struct {
	Ready     int     `json:"ready"`
	Failed    int     `json:"failed"`
	FirstErr  string  `json:"first_err,omitempty"`
	ConnectS  float64 `json:"connect_s"`
	HeapBytes uint64  `json:"heap_bytes"`
}

type workerCmd struct {
	Op string `json:"op"` // "go" or "stop"
	// MeasureFrom/To (Unix ns) bound the send times of measured messages.
	MeasureFrom int64 `json:"measure_from,omitempty"`
	MeasureTo   int64 `json:"measure_to,omitempty"`
	// Acked are the acked seqs as inclusive [lo, hi] ranges.
	Acked [][2]int64 `json:"acked,omitempty"`
}

type workerResult struct {
	Conns       int                    `json:"conns"`
	Measured    int64                  `json:"measured"`   // deliveries of messages sent in the window
	Deliveries  int64                  `json:"deliveries"` // all deliveries
	Lost        int64                  `json:"lost"`       // acked (conn, seq) never delivered
	Duplicates  int64                  `json:"duplicates"` // (conn, seq) delivered twice
	OutOfOrder  int64                  `json:"out_of_order"`
	Pulled      uint64                 `json:"pulled"`
	SDKDups     uint64                 `json:"sdk_dups"`
	Gaps        uint64                 `json:"gaps"`
	Reconnects  uint64                 `json:"reconnects"`
	Resyncs     int64                  `json:"resyncs"`
	Degraded    int64                  `json:"degraded"`
	Summaries   int64                  `json:"summaries"`             // lean: L2 summary frames (the rest of their window is not pulled)
	BadFrames   int64                  `json:"bad_frames"`            // lean: frames the parser could not read
	Disconnects int64                  `json:"disconnects"`           // lean: connections lost before the end
	Pulls       int64                  `json:"pulls,omitempty"`       // kernel with seqs: pull requests sent
	PullErrors  int64                  `json:"pull_errors,omitempty"` // kernel with seqs: pulls answered with an error
	FirstClose  string                 `json:"first_close,omitempty"` // kernel: the first close frame from the server (code and reason)
	Latency     *hdrhistogram.Snapshot `json:"latency"`
	DrainS      float64                `json:"drain_s"`
}

// maxLatencyUS is the largest latency a histogram holds (one minute);
// longer ones are recorded as that.
const maxLatencyUS = 60_000_000

// latency histograms record microseconds up to one minute.
func newLatencyHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, maxLatencyUS, 3) }

// histShards spreads latency recording over several locks.
type histShards struct {
	shards []histShard
}

type histShard struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram
	_  [40]byte // keep shards on separate cache lines
}

func newHistShards(n int) *histShards {
	s := &histShards{shards: make([]histShard, n)}
	for i := range s.shards {
		s.shards[i].h = newLatencyHist()
	}
	return s
}

func (s *histShards) record(i int, us int64) {
	sh := &s.shards[i%len(s.shards)]
	sh.mu.Lock()
	// Clamped: a value out of range would be dropped, and its error
	// allocated.
	_ = sh.h.RecordValue(min(max(us, 1), maxLatencyUS))
	sh.mu.Unlock()
}

func (s *histShards) merged() *hdrhistogram.Histogram {
	h := newLatencyHist()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		h.Merge(sh.h)
		sh.mu.Unlock()
	}
	return h
}

// receiver is one member connection and its ledger. Its fields are
// written by the Conn's OnMessage, which the SDK serializes per Conn, or by
// the lean connection's event loop; mu guards them against the final
// count.
type receiver struct {
	idx  int
	conn *client.Conn // nil for a lean receiver
	mu   sync.Mutex
	seq0 int64
	seen []uint64 // bit s-seq0-1 set: seq s delivered
	last int64
	dups int64
	ooo  int64
	// delivered and measured count first deliveries (all, and of
	// messages sent in the window): per receiver, not shared, so 10k
	// readers do not contend on one cache line.
	delivered int64
	measured  int64
}

// mark records seq, counting it as measured when inWindow; it returns
// false for a duplicate.
func (r *receiver) mark(seq int64, inWindow bool) bool { return r.record(seq, inWindow, false) }

// record is mark; a repair (a seq that came in a pull's answer) below the
// highest seen fills a gap and is not counted out of order.
func (r *receiver) record(seq int64, inWindow, repair bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq <= r.seq0 {
		return false // before the run: not ours to count
	}
	off := seq - r.seq0 - 1
	w := int(off / 64)
	for w >= len(r.seen) {
		r.seen = append(r.seen, 0)
	}
	bit := uint64(1) << (off % 64)
	if r.seen[w]&bit != 0 {
		r.dups++
		return false
	}
	r.seen[w] |= bit
	r.delivered++
	if inWindow {
		r.measured++
	}
	if seq < r.last {
		if !repair {
			r.ooo++
		}
	} else {
		r.last = seq
	}
	return true
}

// markSeq is mark for the server's seqs (kernel receivers with
// workerSpec.Seqs): pulled says seq came in a pull's answer, where a seq
// already delivered is not counted as a duplicate. gapFrom is the first
// seq of a gap a push revealed (seq is past the one after the highest
// seen), 0 when none.
func (r *receiver) markSeq(seq int64, inWindow, pulled bool) (fresh bool, gapFrom int64) {
	r.mu.Lock()
	last := r.last
	r.mu.Unlock()
	if !pulled && seq > last+1 {
		gapFrom = last + 1
	}
	if pulled && r.has(seq) {
		return false, 0
	}
	return r.record(seq, inWindow, pulled), gapFrom
}

// has says seq was delivered.
func (r *receiver) has(seq int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	off := seq - r.seq0 - 1
	if off < 0 {
		return true
	}
	w := int(off / 64)
	return w < len(r.seen) && r.seen[w]&(uint64(1)<<(off%64)) != 0
}

// firstMissing is the lowest seq after seq0 not delivered.
func (r *receiver) firstMissing() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w, word := range r.seen {
		if word != ^uint64(0) {
			return r.seq0 + 1 + int64(w)*64 + int64(bits.TrailingZeros64(^word))
		}
	}
	return r.seq0 + 1 + int64(len(r.seen))*64
}

// highest is the highest seq delivered (seq0 when none).
func (r *receiver) highest() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// missing counts the seqs of acked that r has not received.
func (r *receiver) missing(acked [][2]int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var n int64
	for _, rg := range acked {
		for s := rg[0]; s <= rg[1]; {
			off := s - r.seq0 - 1
			w := int(off / 64)
			if off < 0 {
				s++
				continue
			}
			var word uint64
			if w < len(r.seen) {
				word = r.seen[w]
			}
			// Count the range's bits in this word at once.
			lo := uint(off % 64)
			hi := uint(min(63, int64(lo)+rg[1]-s))
			mask := (^uint64(0) >> (63 - hi)) &^ ((uint64(1) << lo) - 1)
			n += int64(bits.OnesCount64(mask)) - int64(bits.OnesCount64(word&mask))
			s += int64(hi-lo) + 1
		}
	}
	return n
}

// sentAt extracts the send time (Unix ns) from a bench body
// {"t":<ns>,...}; 0 when absent.
func sentAt(body []byte) int64 {
	i := bytes.Index(body, []byte(`"t":`))
	if i < 0 {
		return 0
	}
	var v int64
	for _, c := range body[i+4:] {
		switch {
		case c >= '0' && c <= '9':
			v = v*10 + int64(c-'0')
		case c == ' ' && v == 0:
		default:
			return v
		}
	}
	return v
}

// benchBody returns a body carrying the send time, padded to size bytes.
func benchBody(dst []byte, now int64, size int) []byte {
	dst = append(dst[:0], `{"t":`...)
	dst = strconv.AppendInt(dst, now, 10)
	dst = append(dst, `,"p":"`...)
	for len(dst) < size-2 {
		dst = append(dst, 'x')
	}
	return append(dst, '"', '}')
}

// worker runs the receivers of one spec, reading commands from in and
// writing answers to out.
type worker struct {
	spec        workerSpec
	recv        []*receiver
	hist        *histShards
	measureFrom atomic.Int64
	measureTo   atomic.Int64
	resyncs     atomic.Int64
	degraded    atomic.Int64
	lean        *leanWorker   // -receivers lean
	kernel      *kernelWorker // -receivers kernel (bench peer)
}

func runWorker(ctx context.Context, in io.Reader, out io.Writer, logw io.Writer) error {
	dec := json.NewDecoder(bufio.NewReader(in))
	enc := json.NewEncoder(out)
	var spec workerSpec
	if err := dec.Decode(&spec); err != nil {
		return fmt.Errorf("bench worker: reading spec: %w", err)
	}
	if spec.GoMaxProcs > 0 {
		runtime.GOMAXPROCS(spec.GoMaxProcs)
	}
	switch {
	case spec.GCPercent > 0:
		debug.SetGCPercent(spec.GCPercent)
	case os.Getenv("GOGC") == "":
		// Deliveries allocate a little each; trade memory for GC time.
		debug.SetGCPercent(400)
	}
	w := &worker{spec: spec, hist: newHistShards(64)}
	w.measureFrom.Store(1<<63 - 1)
	ready, err := w.connect(ctx, logw)
	defer w.closeAll()
	if err != nil {
		return err
	}
	if err := enc.Encode(ready); err != nil {
		return err
	}
	for {
		var cmd workerCmd
		if err := dec.Decode(&cmd); err != nil {
			return fmt.Errorf("bench worker: reading command: %w", err)
		}
		switch cmd.Op {
		case "go":
			w.measureTo.Store(cmd.MeasureTo)
			w.measureFrom.Store(cmd.MeasureFrom)
		case "stop":
			res := w.finish(ctx, cmd.Acked)
			return enc.Encode(res)
		default:
			return fmt.Errorf("bench worker: unknown command %q", cmd.Op)
		}
	}
}

// connect dials every member of the spec with bounded concurrency.
func (w *worker) connect(ctx context.Context, logw io.Writer) (workerReady, error) {
	sp := w.spec
	signer, err := auth.NewSigner(auth.SignerConfig{Secret: []byte(sp.Secret)})
	if err != nil {
		return workerReady{}, err
	}
	start := time.Now()
	if sp.Receivers == receiversLean {
		if w.lean, err = newLeanWorker(w, max(sp.Loops, 1), logw); err != nil {
			return workerReady{}, err
		}
	}
	if sp.Receivers == receiversKernel {
		if w.kernel, err = newKernelWorker(w, max(sp.Loops, 1), logw); err != nil {
			return workerReady{}, err
		}
	}
	n := sp.Hi - sp.Lo
	w.recv = make([]*receiver, n)
	var (
		mu       sync.Mutex
		failed   int
		firstErr string
		wg       sync.WaitGroup
		next     atomic.Int64
		done     atomic.Int64
	)
	dctx, cancel := context.WithTimeout(ctx, sp.Deadline)
	defer cancel()
	for range max(1, min(sp.Dials, n)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				r, err := w.dialOne(dctx, signer, sp.Lo+i)
				if err != nil {
					mu.Lock()
					failed++
					if firstErr == "" {
						firstErr = err.Error()
					}
					mu.Unlock()
					continue
				}
				w.recv[i] = r
				if d := done.Add(1); d%5000 == 0 {
					fmt.Fprintf(logw, "bench: worker [%d,%d): %d connected\n", sp.Lo, sp.Hi, d)
				}
			}
		})
	}
	wg.Wait()
	// Keep the connected ones, dense.
	out := w.recv[:0]
	for _, r := range w.recv {
		if r != nil {
			out = append(out, r)
		}
	}
	w.recv = out
	return workerReady{Ready: len(out), Failed: failed, FirstErr: firstErr, ConnectS: time.Since(start).Seconds(), HeapBytes: heapInUse()}, nil
}

func (w *worker) dialOne(ctx context.Context, signer *auth.Signer, idx int) (*receiver, error) {
	sp := w.spec
	r := &receiver{idx: idx, seq0: sp.Seq0, last: sp.Seq0}
	if w.lean != nil || w.kernel != nil {
		dial := func() error {
			if w.kernel != nil {
				return w.kernel.dial(ctx, &sp, signer, r)
			}
			return w.lean.dial(ctx, &sp, signer, r)
		}
		var lastErr error
		for attempt := range 3 {
			if lastErr = dial(); lastErr == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(time.Duration(100*(attempt+1)) * time.Millisecond)
		}
		if lastErr != nil {
			return nil, lastErr
		}
		return r, nil
	}
	tok, err := signer.Sign(sp.Prefix+strconv.Itoa(idx), 0, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	cfg := client.Config{
		URL:            sp.WS,
		Token:          tok,
		ReadBufferSize: sp.ReadBuf,
		Cursors:        map[int64]int64{sp.GID: sp.Seq0},
		GapWait:        100 * time.Millisecond,
		OnMessage:      func(m client.Message) { w.onMessage(r, m) },
		OnEvent: func(ev client.Event) {
			switch ev.Kind {
			case client.EventResync:
				w.resyncs.Add(1)
			case client.EventDegraded:
				w.degraded.Add(1)
			}
		},
	}
	if len(sp.Addrs) > 0 {
		cfg.LocalAddr = sp.Addrs[min(idx/sp.PerAddr, len(sp.Addrs)-1)]
	}
	var lastErr error
	for attempt := range 3 {
		c, err := client.Dial(ctx, cfg)
		if err == nil {
			r.conn = c
			return r, nil
		}
		lastErr = err
		var he *client.HandshakeError
		if ctx.Err() != nil || (errors.As(err, &he) && (he.Status == 401 || he.Status == 403)) {
			break
		}
		time.Sleep(time.Duration(100*(attempt+1)) * time.Millisecond)
	}
	return nil, lastErr
}

// onMessage runs on the SDK's delivery path: keep it cheap.
func (w *worker) onMessage(r *receiver, m client.Message) {
	if m.GID != w.spec.GID {
		return
	}
	t := sentAt(m.Body)
	in := t >= w.measureFrom.Load() && t < w.measureTo.Load()
	if r.mark(m.Seq, in) && in {
		w.hist.record(r.idx, (time.Now().UnixNano()-t)/1000)
	}
}

// finish waits up to the drain time for every receiver to have every
// acked seq, then counts.
func (w *worker) finish(ctx context.Context, acked [][2]int64) workerResult {
	start := time.Now()
	deadline := start.Add(w.spec.Drain)
	var lost int64
	for {
		lost = 0
		for _, r := range w.recv {
			lost += r.missing(acked)
		}
		if lost == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	res := workerResult{
		Conns:    len(w.recv),
		Lost:     lost,
		Resyncs:  w.resyncs.Load(),
		Degraded: w.degraded.Load(),
		DrainS:   time.Since(start).Seconds(),
	}
	for _, r := range w.recv {
		r.mu.Lock()
		res.Duplicates += r.dups
		res.OutOfOrder += r.ooo
		res.Measured += r.measured
		res.Deliveries += r.delivered
		r.mu.Unlock()
		if r.conn == nil {
			continue
		}
		st := r.conn.Stats()
		res.Pulled += st.Pulled
		res.SDKDups += st.Duplicates
		res.Gaps += st.Gaps
		res.Reconnects += st.Reconnects
	}
	if lw := w.lean; lw != nil {
		res.Resyncs += lw.resyncs.Load()
		res.Degraded += lw.degraded.Load()
		res.Summaries = lw.summaries.Load()
		res.BadFrames = lw.badFrames.Load()
		res.Disconnects = lw.disconnects.Load()
	}
	if kw := w.kernel; kw != nil {
		res.BadFrames = kw.badFrames.Load()
		res.Disconnects = kw.disconnects.Load()
		res.Gaps += uint64(kw.gaps.Load())
		res.Resyncs += kw.resyncs.Load()
		res.Summaries = kw.summaries.Load()
		res.Pulls = kw.pulls.Load()
		res.Pulled += uint64(kw.pulled.Load())
		res.PullErrors = kw.pullErrors.Load()
		kw.mu.Lock()
		res.FirstClose = kw.firstClose
		kw.mu.Unlock()
	}
	res.Latency = w.hist.merged().Export()
	return res
}

// closeAll closes every connection, several at a time.
func (w *worker) closeAll() {
	if w.lean != nil {
		w.lean.close()
		return
	}
	if w.kernel != nil {
		w.kernel.close()
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, r := range w.recv {
		if r == nil || r.conn == nil {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			r.conn.Close()
			<-sem
		})
	}
	wg.Wait()
}
