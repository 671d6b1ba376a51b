package sse

import (
	"errors"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWriteThenRead(t *testing.T) {
	rec := httptest.NewRecorder()
	w := NewWriter(rec)
	in := []Event{
		{ID: "1", Type: "assistant_text", Data: []byte(`{"text":"a"}`)},
		{ID: "2", Type: "multi", Data: []byte("line1\nline2")},
		{ID: "3", Data: []byte("")},
	}
	for _, e := range in {
		if err := w.WriteEvent(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteComment("heartbeat"); err != nil {
		t.Fatal(err)
	}
	if got := rec.Header().Get("Content-Type"); got != "text/event-stream" {
		t.Errorf("content type: got %q", got)
	}
	r := NewReader(strings.NewReader(rec.Body.String()))
	var got []Event
	for {
		e, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	want := []Event{in[0], in[1], {ID: "3", Data: []byte{}}}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b []byte) bool { return string(a) == string(b) })); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestReaderLineEndingsAndFields(t *testing.T) {
	stream := ": comment\r\nid: 7\r\nevent: x\r\ndata: a\rdata:b\n\nretry: 300\ndata: c\n\n"
	r := NewReader(strings.NewReader(stream))
	e, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != "7" || e.Type != "x" || string(e.Data) != "a\nb" {
		t.Errorf("first: got %+v data %q", e, e.Data)
	}
	e, err = r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != "7" || e.Type != "" || string(e.Data) != "c" || e.Retry != 300 {
		t.Errorf("second: got %+v data %q", e, e.Data)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("end: got %v, want EOF", err)
	}
}

func TestReaderTruncated(t *testing.T) {
	r := NewReader(strings.NewReader("id: 1\ndata: x\n"))
	if _, err := r.Next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("got %v, want ErrUnexpectedEOF", err)
	}
}

func TestWriterRefusesInjection(t *testing.T) {
	w := NewWriter(httptest.NewRecorder())
	if err := w.WriteEvent(Event{ID: "1\ndata: x", Data: []byte("y")}); !errors.Is(err, ErrInvalidField) {
		t.Errorf("got %v, want ErrInvalidField", err)
	}
}

func TestParseID(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "0": 0, "42": 42} {
		if got, err := ParseID(in); err != nil || got != want {
			t.Errorf("ParseID(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1", "x", "1.5", "99999999999999999999"} {
		if _, err := ParseID(bad); err == nil {
			t.Errorf("ParseID(%q): got nil error", bad)
		}
	}
}

func FuzzReader(f *testing.F) {
	f.Add("id: 1\nevent: a\ndata: {}\n\n")
	f.Add("data: a\r\ndata: b\r\r\n")
	f.Add(": x\n\n\n")
	f.Fuzz(func(t *testing.T, s string) {
		r := NewReader(strings.NewReader(s))
		r.maxLine = 1 << 10
		for i := 0; i < 1000; i++ {
			e, err := r.Next()
			if err != nil {
				return
			}
			if strings.ContainsAny(e.ID, "\r\n") || strings.ContainsAny(e.Type, "\r\n") {
				t.Fatalf("field holds a line break: %+v", e)
			}
		}
	})
}
