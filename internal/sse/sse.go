// Package sse reads and writes server-sent events, the text/event-stream
// format of the WHATWG HTML standard ("Server-sent events", §9.2).
//
// Writer frames events and flushes each one; Conn does the same on a
// connection taken over from the HTTP server (Hijack); Reader parses a stream into
// events, accepting LF, CRLF and CR line ends, comments, multi-line data and
// the id/event/retry fields. It is used for the worker's event stream, the
// browser stream and in tests of the gateway; the gateway-proxy itself never
// re-frames Anthropic's stream (it passes bytes through).
package sse

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Event is one server-sent event. ID and Type are empty when absent; Data is
// the data lines joined with "\n".
type Event struct {
	ID    string
	Type  string
	Data  []byte
	Retry int // reconnection time in milliseconds; 0 when absent
}

// Writer writes events to an HTTP response, flushing after each.
type Writer struct {
	w  io.Writer
	rc *http.ResponseController
}

// NewWriter sets the text/event-stream headers on w (including
// "X-Accel-Buffering: no" so reverse proxies in front do not buffer) and
// returns a Writer. It does not write the status line.
func NewWriter(w http.ResponseWriter) *Writer {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	return &Writer{w: w, rc: http.NewResponseController(w)}
}

// ErrInvalidField is returned by WriteEvent for an id or type holding a line
// break (which would inject fields).
var ErrInvalidField = errors.New("sse: field holds a line break")

// Frame returns e framed as it goes on the wire (its fields, its data
// lines, the blank line that ends it): built once, it can be written to
// any number of streams with WriteFrame. Data may hold newlines; each line
// becomes a "data:" line. The error is ErrInvalidField.
func Frame(e Event) ([]byte, error) {
	if strings.ContainsAny(e.ID, "\r\n\x00") || strings.ContainsAny(e.Type, "\r\n") {
		return nil, ErrInvalidField
	}
	var b bytes.Buffer
	b.Grow(len(e.Data) + 64)
	if e.ID != "" {
		b.WriteString("id: ")
		b.WriteString(e.ID)
		b.WriteByte('\n')
	}
	if e.Type != "" {
		b.WriteString("event: ")
		b.WriteString(e.Type)
		b.WriteByte('\n')
	}
	if e.Retry > 0 {
		b.WriteString("retry: ")
		b.WriteString(strconv.Itoa(e.Retry))
		b.WriteByte('\n')
	}
	for line := range bytes.Lines(e.Data) {
		line = bytes.TrimRight(line, "\r\n")
		b.WriteString("data: ")
		b.Write(line)
		b.WriteByte('\n')
	}
	if len(e.Data) == 0 {
		b.WriteString("data:\n")
	}
	b.WriteByte('\n')
	return b.Bytes(), nil
}

// JSONFrame is Frame of an event whose data is v marshalled as JSON.
func JSONFrame(id, typ string, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("sse: marshal %s event: %w", typ, err)
	}
	return Frame(Event{ID: id, Type: typ, Data: data})
}

// WriteEvent writes e and flushes it (see Frame).
func (s *Writer) WriteEvent(e Event) error {
	b, err := Frame(e)
	if err != nil {
		return err
	}
	return s.WriteFrame(b)
}

// WriteFrame writes a frame made by Frame or JSONFrame and flushes it.
func (s *Writer) WriteFrame(frame []byte) error {
	if _, err := s.w.Write(frame); err != nil {
		return err
	}
	return s.Flush()
}

// WriteJSON writes an event whose data is v marshalled as JSON.
func (s *Writer) WriteJSON(id, typ string, v any) error {
	b, err := JSONFrame(id, typ, v)
	if err != nil {
		return err
	}
	return s.WriteFrame(b)
}

// WriteComment writes a comment line (": text"), used as a heartbeat that
// keeps idle connections open through proxies, and flushes it.
func (s *Writer) WriteComment(text string) error {
	if _, err := io.WriteString(s.w, ": "+strings.ReplaceAll(text, "\n", " ")+"\n\n"); err != nil {
		return err
	}
	return s.Flush()
}

// Flush sends buffered bytes to the client.
func (s *Writer) Flush() error {
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// Reader parses events from a stream.
type Reader struct {
	br      *bufio.Reader
	maxLine int
	// lastID persists across events, as the standard's "last event ID buffer".
	lastID string
}

// DefaultMaxLine bounds one line of the stream (16 MiB).
const DefaultMaxLine = 16 << 20

// ErrLineTooLong is returned by Next when a line exceeds the limit.
var ErrLineTooLong = errors.New("sse: line too long")

// NewReader returns a Reader of r with lines bounded by DefaultMaxLine. Its
// read buffer is 4 KiB (a line may be longer: lines are collected apart
// from it): a control plane holds one Reader per browser stream, thousands
// at once, so the buffer is most of a stream's memory.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, readBufferSize), maxLine: DefaultMaxLine}
}

// readBufferSize is a Reader's read buffer.
const readBufferSize = 4 << 10

// readLine returns the next line without its terminator (LF, CRLF or CR).
func (r *Reader) readLine() ([]byte, error) {
	var line []byte
	for {
		b, err := r.br.ReadByte()
		if err != nil {
			if err == io.EOF && len(line) > 0 {
				// An unterminated last line is discarded by the standard's
				// parser (the event is incomplete); report EOF.
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		switch b {
		case '\n':
			return line, nil
		case '\r':
			if next, err := r.br.Peek(1); err == nil && next[0] == '\n' {
				_, _ = r.br.ReadByte()
			}
			return line, nil
		}
		if len(line) >= r.maxLine {
			return nil, ErrLineTooLong
		}
		line = append(line, b)
	}
}

// Next returns the next event. ID is the last event id seen so far in the
// stream (it persists across events, as in the standard). It returns io.EOF
// at a clean end of stream and io.ErrUnexpectedEOF when the stream ends inside
// an event.
func (r *Reader) Next() (Event, error) {
	var (
		e       Event
		data    bytes.Buffer
		hasData bool
		any     bool
	)
	for {
		line, err := r.readLine()
		if err != nil {
			if err == io.EOF && any {
				return Event{}, io.ErrUnexpectedEOF
			}
			return Event{}, err
		}
		if len(line) == 0 {
			if !hasData {
				// Events without data are not dispatched; keep id/type reset.
				e.Type = ""
				any = false
				continue
			}
			e.ID = r.lastID
			e.Data = data.Bytes()
			return e, nil
		}
		any = true
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			e.Type = string(value)
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.Write(value)
			hasData = true
		case "id":
			if !bytes.ContainsRune(value, 0) {
				r.lastID = string(value)
			}
		case "retry":
			if n, err := strconv.Atoi(string(value)); err == nil && n >= 0 {
				e.Retry = n
			}
		}
	}
}

// ParseID parses an event id as a non-negative integer sequence number, the
// form every TalkIDE stream uses. An empty id is 0.
func ParseID(id string) (int64, error) {
	if id == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(id), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("parse event id %q: want a non-negative integer", id)
	}
	return n, nil
}

// WriteFrames writes frames made by Frame or JSONFrame and flushes once.
func (s *Writer) WriteFrames(frames [][]byte) error {
	for _, f := range frames {
		if _, err := s.w.Write(f); err != nil {
			return err
		}
	}
	return s.Flush()
}
