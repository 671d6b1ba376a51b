package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fakeSender records attempts and fails as told.
type fakeSender struct {
	mu sync.Mutex
	// down makes every attempt fail (transient).
	down bool
	// flaky fails attempts at random (transient), half of them after
	// "storing" the report (a lost acknowledgement).
	flaky *rand.Rand
	// refuse makes entries with these keys fail for good.
	refuse map[string]bool
	// stored are the keys the receiver stored, each once, per conversation
	// in arrival order.
	stored map[string][]string
	seen   map[string]bool
	// attempts per conversation, in order.
	attempts map[string][]string
}

func newFakeSender() *fakeSender {
	return &fakeSender{refuse: map[string]bool{}, stored: map[string][]string{}, seen: map[string]bool{}, attempts: map[string][]string{}}
}

func (f *fakeSender) Send(ctx context.Context, e Entry) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts[e.Conversation] = append(f.attempts[e.Conversation], e.Key)
	if f.down {
		return nil, errors.New("connection refused")
	}
	if f.refuse[e.Key] {
		return nil, &PermanentError{Status: 400, Msg: "bad report"}
	}
	if f.flaky != nil && f.flaky.IntN(3) == 0 {
		if f.flaky.IntN(2) == 0 {
			return nil, errors.New("503 unavailable")
		}
		f.store(e) // stored, but the answer is lost
		return nil, errors.New("connection reset")
	}
	f.store(e)
	return []byte(`{"ok":"` + e.Key + `"}`), nil
}

func (f *fakeSender) store(e Entry) {
	if !f.seen[e.Key] {
		f.seen[e.Key] = true
		f.stored[e.Conversation] = append(f.stored[e.Conversation], e.Key)
	}
}

func (f *fakeSender) setDown(v bool) {
	f.mu.Lock()
	f.down = v
	f.mu.Unlock()
}

func (f *fakeSender) storedOf(conv string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.stored[conv]...)
}

func open(t *testing.T, dir string, s Sender, mod func(*Config)) *Outbox {
	t.Helper()
	cfg := Config{Dir: dir, Sender: s, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)}
	if mod != nil {
		mod(&cfg)
	}
	o, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func run(t *testing.T, o *Outbox) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.Run(ctx); close(done) }()
	return func() { cancel(); <-done }
}

// waitEmpty waits until the outbox has delivered everything (no fixed
// sleep: it polls the count).
func waitEmpty(t *testing.T, o *Outbox) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if n, _ := o.Len(); n == 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	n, _ := o.Len()
	t.Fatalf("outbox still holds %d entries", n)
}

func keys(conv string, n int) []string {
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("%s:%d", conv, i))
	}
	return out
}

func put(t *testing.T, o *Outbox, conv string, ks []string) {
	t.Helper()
	for _, k := range ks {
		if _, err := o.Put(conv, "POST", "/r", k, []byte(`{"k":"`+k+`"}`)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDeliversEachReportOnceInOrderDespiteFailures(t *testing.T) {
	s := newFakeSender()
	s.flaky = rand.New(rand.NewPCG(1, 2))
	o := open(t, t.TempDir(), s, nil)
	stop := run(t, o)
	defer stop()
	convs := []string{"c1", "c2", "c3"}
	var wg sync.WaitGroup
	for _, c := range convs {
		wg.Go(func() { put(t, o, c, keys(c, 40)) })
	}
	wg.Wait()
	waitEmpty(t, o)
	for _, c := range convs {
		if got, want := s.storedOf(c), keys(c, 40); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s stored %v, want %v", c, got, want)
		}
		// Attempts never run ahead: each key is tried only after every
		// earlier key of the conversation was acknowledged.
		s.mu.Lock()
		last := -1
		for _, k := range s.attempts[c] {
			var n int
			fmt.Sscanf(k[len(c)+1:], "%d", &n)
			if n < last {
				t.Errorf("%s: attempt of %s after %d", c, k, last)
			}
			last = n
		}
		s.mu.Unlock()
	}
}

func TestRestartResumesSending(t *testing.T) {
	dir := t.TempDir()
	s := newFakeSender()
	s.setDown(true)
	o := open(t, dir, s, nil)
	stop := run(t, o)
	put(t, o, "c1", keys("c1", 5))
	put(t, o, "c2", keys("c2", 3))
	stop() // the worker stops while the control plane is down

	s.setDown(false)
	o2 := open(t, dir, s, nil)
	if n, _ := o2.Len(); n != 8 {
		t.Fatalf("reopened outbox holds %d entries, want 8", n)
	}
	// New reports after the restart queue behind the old ones.
	put(t, o2, "c1", []string{"c1:5"})
	stop2 := run(t, o2)
	defer stop2()
	waitEmpty(t, o2)
	if got := s.storedOf("c1"); fmt.Sprint(got) != fmt.Sprint(keys("c1", 6)) {
		t.Errorf("c1 stored %v", got)
	}
	if got := s.storedOf("c2"); fmt.Sprint(got) != fmt.Sprint(keys("c2", 3)) {
		t.Errorf("c2 stored %v", got)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "queue", "*", "*"))
	if len(left) != 0 {
		t.Errorf("files left after delivery: %v", left)
	}
}

func TestBoundRefusesAndCountsThenRecovers(t *testing.T) {
	s := newFakeSender()
	s.setDown(true)
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	o := open(t, t.TempDir(), s, func(c *Config) { c.MaxEntries = 3; c.Metrics = m })
	put(t, o, "c1", keys("c1", 3))
	for range 2 {
		if _, err := o.Put("c1", "POST", "/r", "c1:x", []byte(`{}`)); !errors.Is(err, ErrFull) {
			t.Fatalf("put beyond the bound: got %v, want ErrFull", err)
		}
	}
	if got := value(m.fullTotal); got != 2 {
		t.Errorf("talkide_worker_outbox_full_total = %v, want 2", got)
	}
	if got := value(m.entries); got != 3 {
		t.Errorf("talkide_worker_outbox_entries = %v, want 3", got)
	}
	space := o.Space()
	stop := run(t, o)
	defer stop()
	s.setDown(false)
	<-space
	if _, err := o.Put("c1", "POST", "/r", "c1:3", []byte(`{}`)); err != nil {
		t.Fatalf("put after room was freed: %v", err)
	}
	waitEmpty(t, o)
	if got := s.storedOf("c1"); fmt.Sprint(got) != fmt.Sprint(keys("c1", 4)) {
		t.Errorf("stored %v", got)
	}
	if got := value(m.delivers); got != 4 {
		t.Errorf("delivered = %v, want 4", got)
	}
}

func TestPermanentRefusalGoesToDeadAndLaneContinues(t *testing.T) {
	dir := t.TempDir()
	s := newFakeSender()
	s.refuse["c1:1"] = true
	o := open(t, dir, s, nil)
	seqs := map[string]int64{}
	for _, k := range keys("c1", 3) {
		seq, err := o.Put("c1", "POST", "/r", k, []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		seqs[k] = seq
	}
	type res struct {
		r  Result
		ok bool
	}
	results := map[string]chan res{}
	for k, seq := range seqs {
		ch := make(chan res, 1)
		results[k] = ch
		go func() { r, ok := o.Wait(t.Context(), "c1", seq); ch <- res{r, ok} }()
	}
	time.Sleep(10 * time.Millisecond) // let the waiters register (not an assertion)
	stop := run(t, o)
	defer stop()
	waitEmpty(t, o)
	if got := s.storedOf("c1"); fmt.Sprint(got) != "[c1:0 c1:2]" {
		t.Errorf("stored %v, want c1:0 and c1:2", got)
	}
	for k, ch := range results {
		r := <-ch
		switch {
		case !r.ok:
			// Registered too late (already finished): fine for this test.
		case k == "c1:1" && (r.r.Delivered || r.r.Err == nil):
			t.Errorf("refused entry: %+v", r.r)
		case k != "c1:1" && (!r.r.Delivered || string(r.r.Body) != `{"ok":"`+k+`"}`):
			t.Errorf("%s: %+v", k, r.r)
		}
	}
	dead, _ := os.ReadDir(filepath.Join(dir, "dead"))
	if len(dead) != 1 {
		t.Errorf("dead/ holds %d files, want 1", len(dead))
	}
}

func TestUnknownFormatIsNotSent(t *testing.T) {
	dir := t.TempDir()
	s := newFakeSender()
	o := open(t, dir, s, nil)
	os.MkdirAll(filepath.Join(dir, "queue", "c1"), 0o700)
	os.WriteFile(filepath.Join(dir, "queue", "c1", fmt.Sprintf("%020d.json", 7)), []byte(`{"format":99,"seq":7}`), 0o600)
	os.WriteFile(filepath.Join(dir, "queue", "c1", ".00000000000000000008.json.tmp-1"), []byte(`partial`), 0o600)
	o = open(t, dir, s, nil)
	stop := run(t, o)
	defer stop()
	waitEmpty(t, o)
	if got := s.storedOf("c1"); len(got) != 0 {
		t.Errorf("sent %v", got)
	}
}

// value reads a counter or gauge.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}
