package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// RequestHead is what the gateway needs of a Messages request body to price
// it: the top-level "model", "max_tokens", "stream", "thinking", "tools" and
// "mcp_servers" members, read as the upstream reads them.
type RequestHead struct {
	Model     string
	MaxTokens int64
	Stream    bool
	// ThinkingBudget is thinking.budget_tokens, in tokens (0 when absent).
	// The upstream requires it below max_tokens.
	ThinkingBudget int64
	// ServerTools are the declared tools the upstream runs itself (web
	// search, web fetch, code execution, MCP toolsets and any typed tool
	// not known to run on the client; see IsClientTool), in request order.
	ServerTools []ServerTool
	// MCPServers counts the entries of mcp_servers (the MCP connector: the
	// upstream calls those servers itself).
	MCPServers int
	// maxTokensAt is the byte range of the max_tokens value in the body
	// (both 0 when absent), for WithMaxTokens.
	maxTokensAt [2]int
}

// ServerTool is one server tool declared in a request's tools.
type ServerTool struct {
	// Type is the tool's "type", e.g. "web_search_20250305".
	Type string
	// MaxUses is "max_uses", 0 when absent (no limit of the request's own).
	MaxUses int64
	// MaxContentTokens is "max_content_tokens" (web fetch), 0 when absent.
	MaxContentTokens int64
}

// clientToolPrefixes are the types of Anthropic-defined tools that the
// client runs (their results come back, and are billed, in the next
// request): the upstream charges nothing for them beyond tokens.
var clientToolPrefixes = []string{"bash_", "text_editor_", "computer_", "memory_"}

// IsClientTool reports whether a tool of type typ runs on the client: no
// type or "custom" (a tool the client defines), or one of the
// Anthropic-defined client tools (bash, text editor, computer use, memory).
// Every other type is a server tool.
func IsClientTool(typ string) bool {
	if typ == "" || typ == "custom" {
		return true
	}
	for _, p := range clientToolPrefixes {
		if strings.HasPrefix(typ, p) {
			return true
		}
	}
	return false
}

// WithMaxTokens returns a copy of body, the request h was scanned from,
// with max_tokens set to n. ok is false when body has no max_tokens member.
func (h RequestHead) WithMaxTokens(body []byte, n int64) (out []byte, ok bool) {
	at := h.maxTokensAt
	if at[1] <= at[0] || at[1] > len(body) {
		return nil, false
	}
	v := strconv.AppendInt(nil, n, 10)
	out = make([]byte, 0, len(body)-(at[1]-at[0])+len(v))
	out = append(out, body[:at[0]]...)
	out = append(out, v...)
	return append(out, body[at[1]:]...), true
}

// ErrMalformedRequest is wrapped by ScanRequestHead errors.
var ErrMalformedRequest = errors.New("malformed Messages request")

// ErrAmbiguousRequest is wrapped by ScanRequestHead errors for a body whose
// priced members common JSON parsers read differently; it wraps
// ErrMalformedRequest too.
var ErrAmbiguousRequest = fmt.Errorf("%w: ambiguous priced member", ErrMalformedRequest)

// pricedMembers are the top-level members that decide what a call may cost.
var pricedMembers = []string{"model", "max_tokens", "stream", "thinking", "tools", "mcp_servers"}

// toolMembers and thinkingMembers are the priced members inside a tool and
// inside thinking.
var (
	toolMembers     = []string{"type", "max_uses", "max_content_tokens"}
	thinkingMembers = []string{"budget_tokens"}
)

// ScanRequestHead reads the priced members of a Messages request body (see
// RequestHead) without decoding the rest (messages and system prompts are
// skipped byte by byte, several times faster than encoding/json). The body
// must be one JSON object; errors wrap ErrMalformedRequest.
//
// What is priced must be what the upstream reads, so a priced member
// (top-level, or "type", "max_uses", "max_content_tokens" in a tool,
// "budget_tokens" in thinking) must be spelled exactly, once: a name
// given twice, or written with escapes ("mod\u0065l") or in another case
// ("Model", "max_to\u212aens" with a Kelvin sign: encoding/json matches
// member names case-insensitively) is refused with an error wrapping
// ErrAmbiguousRequest, since parsers disagree on which member counts. A
// model whose decoding needs a replacement character (invalid UTF-8, a lone
// surrogate) is refused likewise. It checks the structure it walks through,
// not every detail of the skipped values: the upstream validates the body in
// full.
func ScanRequestHead(b []byte) (RequestHead, error) {
	var h RequestHead
	s := scanner{b: b}
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return h, s.fail("want a JSON object")
	}
	var seen [6]bool
	more, err := s.open()
	for more && err == nil {
		var k int
		if k, err = s.name(pricedMembers, seen[:]); err != nil {
			break
		}
		switch k {
		case 0: // model
			err = s.model(&h)
		case 1: // max_tokens
			start := s.i
			var null bool
			if h.MaxTokens, null, err = s.integer("max_tokens"); err == nil && !null {
				h.maxTokensAt = [2]int{start, s.i}
			}
		case 2: // stream
			err = s.stream(&h)
		case 3: // thinking
			err = s.thinking(&h)
		case 4: // tools
			err = s.tools(&h)
		case 5: // mcp_servers
			err = s.mcpServers(&h)
		default:
			if !s.skip(1) {
				err = s.fail("bad value")
			}
		}
		if err == nil {
			more, err = s.next()
		}
	}
	if err != nil {
		return h, err
	}
	s.ws()
	if s.i != len(s.b) {
		return h, s.fail("trailing data after the object")
	}
	return h, nil
}

// open consumes the '{' of an object; more is false when it is empty.
func (s *scanner) open() (more bool, err error) {
	s.ws()
	if !s.eat('{') {
		return false, s.fail("want an object")
	}
	s.ws()
	return !s.eat('}'), nil
}

// next consumes what follows a member's value: more is true after a ',',
// false after the object's '}'.
func (s *scanner) next() (more bool, err error) {
	s.ws()
	if s.eat(',') {
		return true, nil
	}
	if s.eat('}') {
		return false, nil
	}
	return false, s.fail("want ',' or '}'")
}

// name consumes a member name and its ':' and returns the name's index in
// names (recording it in seen, one flag per name), or -1 for another name.
// A name given twice, or one that decodes or case-folds to one of names
// without being spelled exactly, is refused (see ScanRequestHead).
func (s *scanner) name(names []string, seen []bool) (int, error) {
	s.ws()
	at := s.i
	key, ok := s.str()
	if !ok {
		return -1, s.fail("want a member name")
	}
	s.ws()
	if !s.eat(':') {
		return -1, s.fail("want ':'")
	}
	s.ws()
	k, err := s.match(names, key, at)
	if err != nil || k < 0 {
		return k, err
	}
	if seen[k] {
		return -1, s.ambiguous(at, fmt.Sprintf("%q given twice", names[k]))
	}
	seen[k] = true
	return k, nil
}

// match returns the index in names of key (a raw member name with its
// quotes), -1 for a name not among them, or an ErrAmbiguousRequest error
// for a name that other parsers would read as one of them.
func (s *scanner) match(names []string, key []byte, at int) (int, error) {
	raw := key[1 : len(key)-1]
	plain := true // ASCII without escapes: read the same by every parser
	for _, c := range raw {
		if c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		for k, n := range names {
			if string(raw) == n {
				return k, nil
			}
		}
		for _, n := range names {
			if asciiEqualFold(raw, n) {
				return -1, s.ambiguous(at, fmt.Sprintf("member %s is read as %q by common JSON parsers; spell it exactly", key, n))
			}
		}
		return -1, nil
	}
	var name string
	if err := json.Unmarshal(key, &name); err != nil {
		return -1, s.failAt(at, "member name: "+err.Error())
	}
	for _, n := range names {
		if strings.EqualFold(name, n) { // exact included: written with escapes
			return -1, s.ambiguous(at, fmt.Sprintf("member %s is read as %q by common JSON parsers; spell it exactly", key, n))
		}
	}
	return -1, nil
}

// asciiEqualFold is strings.EqualFold for an ASCII b.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

func (s *scanner) ambiguous(at int, msg string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrAmbiguousRequest, msg, at)
}

// openArray consumes the '[' of an array (or a null, read as empty); more
// is false when it is empty.
func (s *scanner) openArray(name string) (more bool, err error) {
	if s.peekNull() {
		return false, nil
	}
	if !s.eat('[') {
		return false, s.fail(name + ": want an array")
	}
	s.ws()
	return !s.eat(']'), nil
}

// nextElem consumes what follows an array element: more is true after a
// ',', false after the array's ']'.
func (s *scanner) nextElem(name string) (more bool, err error) {
	s.ws()
	if s.eat(',') {
		return true, nil
	}
	if s.eat(']') {
		return false, nil
	}
	return false, s.fail(name + ": want ',' or ']'")
}

func (s *scanner) mcpServers(h *RequestHead) error {
	more, err := s.openArray("mcp_servers")
	for more && err == nil {
		s.ws()
		h.MCPServers++
		if !s.skip(1) {
			return s.fail("mcp_servers: bad value")
		}
		more, err = s.nextElem("mcp_servers")
	}
	return err
}

func (s *scanner) tools(h *RequestHead) error {
	more, err := s.openArray("tools")
	for more && err == nil {
		s.ws()
		if err = s.tool(h); err != nil {
			return err
		}
		more, err = s.nextElem("tools")
	}
	return err
}

// tool consumes one element of tools and records it when it is a server
// tool.
func (s *scanner) tool(h *RequestHead) error {
	if s.peekNull() {
		return nil // read as a tool without a type by encoding/json; the upstream refuses it
	}
	var t ServerTool
	var seen [3]bool
	more, err := s.open()
	for more && err == nil {
		var k int
		if k, err = s.name(toolMembers, seen[:]); err != nil {
			return err
		}
		switch k {
		case 0:
			t.Type, err = s.string("tools[].type")
		case 1:
			t.MaxUses, _, err = s.integer("tools[].max_uses")
		case 2:
			t.MaxContentTokens, _, err = s.integer("tools[].max_content_tokens")
		default:
			if !s.skip(1) {
				err = s.fail("bad value")
			}
		}
		if err == nil {
			more, err = s.next()
		}
	}
	if err != nil {
		return err
	}
	if t.MaxUses < 0 || t.MaxContentTokens < 0 {
		return s.fail("tools[]: max_uses and max_content_tokens must not be negative")
	}
	if !IsClientTool(t.Type) {
		h.ServerTools = append(h.ServerTools, t)
	}
	return nil
}

func (s *scanner) thinking(h *RequestHead) error {
	if s.peekNull() {
		return nil
	}
	var seen [1]bool
	more, err := s.open()
	for more && err == nil {
		var k int
		if k, err = s.name(thinkingMembers, seen[:]); err != nil {
			return err
		}
		if k == 0 {
			h.ThinkingBudget, _, err = s.integer("thinking.budget_tokens")
		} else if !s.skip(1) {
			err = s.fail("bad value")
		}
		if err == nil {
			more, err = s.next()
		}
	}
	return err
}

type scanner struct {
	b []byte
	i int
}

func (s *scanner) fail(msg string) error { return s.failAt(s.i, msg) }

func (s *scanner) failAt(at int, msg string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrMalformedRequest, msg, at)
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
	if s.peekNull() {
		h.Model = ""
		return nil
	}
	at := s.i
	m, err := s.string("model")
	if err != nil {
		return err
	}
	if strings.ContainsRune(m, utf8.RuneError) {
		return s.ambiguous(at, "model: invalid UTF-8 or a lone surrogate, which parsers decode differently")
	}
	h.Model = m
	return nil
}

// string consumes a string value (or null, read as "") and decodes it.
func (s *scanner) string(what string) (string, error) {
	if s.peekNull() {
		return "", nil
	}
	raw, ok := s.str()
	if !ok {
		return "", s.fail(what + ": want a string")
	}
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw[1 : len(raw)-1]), nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", s.fail(what + ": " + err.Error())
	}
	return v, nil
}

// integer consumes an integer value (or null, read as 0; null reports it).
func (s *scanner) integer(what string) (n int64, null bool, err error) {
	if s.peekNull() {
		return 0, true, nil
	}
	lit := s.literal()
	n, perr := strconv.ParseInt(string(lit), 10, 64)
	if perr != nil || len(lit) > 1 && lit[0] == '0' || len(lit) > 0 && lit[0] == '+' || len(lit) > 2 && lit[0] == '-' && lit[1] == '0' {
		return 0, false, s.fail(what + ": want an integer")
	}
	return n, false, nil
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
