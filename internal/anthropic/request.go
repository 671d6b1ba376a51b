package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// RequestHead is what the gateway needs of a Messages request body to price
// it: the top-level "model", "max_tokens" and "stream" members.
type RequestHead struct {
	Model     string
	MaxTokens int64
	Stream    bool
}

// ErrMalformedRequest is wrapped by ScanRequestHead errors.
var ErrMalformedRequest = errors.New("malformed Messages request")

// ScanRequestHead reads the top-level model, max_tokens and stream members
// of a Messages request body without decoding the rest (messages, tools and
// system prompts are skipped byte by byte, several times faster than
// encoding/json). A member given twice is an error: parsers disagree on
// which one counts, and a body the gateway prices by one max_tokens must not
// run upstream with another. The body must be one JSON object; errors wrap
// ErrMalformedRequest. It checks the structure it walks through, not every
// detail of the skipped values: the upstream validates the body in full.
func ScanRequestHead(b []byte) (RequestHead, error) {
	var h RequestHead
	s := scanner{b: b}
	s.ws()
	if !s.eat('{') {
		return h, s.fail("want a JSON object")
	}
	s.ws()
	seen := map[string]bool{}
	if !s.eat('}') {
		for {
			s.ws()
			key, ok := s.str()
			if !ok {
				return h, s.fail("want a member name")
			}
			s.ws()
			if !s.eat(':') {
				return h, s.fail("want ':'")
			}
			s.ws()
			var err error
			switch k := string(key); k {
			case `"model"`, `"max_tokens"`, `"stream"`:
				if seen[k] {
					return h, s.fail(k + " given twice")
				}
				seen[k] = true
			}
			switch string(key) {
			case `"model"`:
				err = s.model(&h)
			case `"max_tokens"`:
				err = s.maxTokens(&h)
			case `"stream"`:
				err = s.stream(&h)
			default:
				if !s.skip(0) {
					err = s.fail("bad value")
				}
			}
			if err != nil {
				return h, err
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			if s.eat('}') {
				break
			}
			return h, s.fail("want ',' or '}'")
		}
	}
	s.ws()
	if s.i != len(s.b) {
		return h, s.fail("trailing data after the object")
	}
	return h, nil
}

type scanner struct {
	b []byte
	i int
}

func (s *scanner) fail(msg string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrMalformedRequest, msg, s.i)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str consumes a string and returns it with its quotes, undecoded.
//
// It jumps from quote to quote (bytes.IndexByte) rather than reading every
// byte: a request's strings are most of its tens of kilobytes. A quote is
// the end unless an odd number of backslashes precedes it. Control
// characters inside a string are left for the upstream to refuse.
func (s *scanner) str() ([]byte, bool) {
	start := s.i
	if !s.eat('"') {
		return nil, false
	}
	for {
		j := bytes.IndexByte(s.b[s.i:], '"')
		if j < 0 {
			s.i = len(s.b)
			return nil, false
		}
		s.i += j + 1
		escapes := 0
		for k := s.i - 2; k > start && s.b[k] == '\\'; k-- {
			escapes++
		}
		if escapes%2 == 0 {
			return s.b[start:s.i], true
		}
	}
}

// literal consumes a number, true, false or null and returns it.
func (s *scanner) literal() []byte {
	start := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r', ':', '"', '{', '[':
			return s.b[start:s.i]
		}
		s.i++
	}
	return s.b[start:s.i]
}

// maxDepth bounds nesting, as encoding/json does (10000).
const maxDepth = 10000

// skip consumes one value of any kind.
func (s *scanner) skip(depth int) bool {
	if depth > maxDepth || s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '"':
		_, ok := s.str()
		return ok
	case '{', '[':
		open := s.b[s.i]
		closer := byte('}')
		if open == '[' {
			closer = ']'
		}
		s.i++
		s.ws()
		if s.eat(closer) {
			return true
		}
		for {
			s.ws()
			if open == '{' {
				if _, ok := s.str(); !ok {
					return false
				}
				s.ws()
				if !s.eat(':') {
					return false
				}
				s.ws()
			}
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(',') {
				continue
			}
			return s.eat(closer)
		}
	}
	lit := s.literal()
	if len(lit) == 0 {
		return false
	}
	switch string(lit) {
	case "true", "false", "null":
		return true
	}
	return json.Valid(lit) // a number
}

func (s *scanner) model(h *RequestHead) error {
	if lit := s.peekNull(); lit {
		h.Model = ""
		return nil
	}
	raw, ok := s.str()
	if !ok {
		return s.fail("model: want a string")
	}
	if err := json.Unmarshal(raw, &h.Model); err != nil {
		return s.fail("model: " + err.Error())
	}
	return nil
}

func (s *scanner) maxTokens(h *RequestHead) error {
	if s.peekNull() {
		h.MaxTokens = 0
		return nil
	}
	lit := s.literal()
	n, err := strconv.ParseInt(string(lit), 10, 64)
	if err != nil || len(lit) > 1 && lit[0] == '0' || len(lit) > 0 && lit[0] == '+' {
		return s.fail("max_tokens: want an integer")
	}
	h.MaxTokens = n
	return nil
}

func (s *scanner) stream(h *RequestHead) error {
	if s.peekNull() {
		h.Stream = false
		return nil
	}
	switch string(s.literal()) {
	case "true":
		h.Stream = true
	case "false":
		h.Stream = false
	default:
		return s.fail("stream: want true or false")
	}
	return nil
}

// peekNull consumes a null literal if one is next.
func (s *scanner) peekNull() bool {
	if len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		j := s.i + 4
		if j == len(s.b) || !isLiteralByte(s.b[j]) {
			s.i = j
			return true
		}
	}
	return false
}

func isLiteralByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '+' || c == 'E'
}
