package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/talkide/talkide/internal/httpapi"
)

// maxNamedErrorBody bounds the upstream error bodies nameRequest rewrites.
const maxNamedErrorBody = 64 << 10

// nameRequest ends the message of an upstream error answer (status ≥ 400,
// Anthropic's JSON envelope) with " (request <id>)", id being the call's
// TalkIDE request id, as the gateway's own refusals do: Claude Code shows
// only the message, and the id finds the call in the worker's and the
// control plane's logs. Anthropic's own request_id and request-id header
// are left as they are (they are what Anthropic's support asks for). An
// answer that is streamed, compressed, over 64 KiB or not such an envelope
// passes unchanged.
func nameRequest(resp *http.Response, id string) {
	if resp.StatusCode < 400 || id == "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return
	}
	orig := resp.Body
	b, err := io.ReadAll(io.LimitReader(orig, maxNamedErrorBody+1))
	rest := func() {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), orig), orig}
	}
	if err != nil || len(b) > maxNamedErrorBody {
		rest()
		return
	}
	start, end, msg, ok := errorMessageAt(b)
	if !ok || httpapi.NamedMessage(msg, id) == msg {
		rest()
		return
	}
	named, _ := json.Marshal(httpapi.NamedMessage(msg, id))
	nb := append(append(append(make([]byte, 0, len(b)+len(named)), b[:start]...), named...), b[end:]...)
	orig.Close()
	resp.Body = io.NopCloser(bytes.NewReader(nb))
	resp.ContentLength = int64(len(nb))
	resp.Header.Set("Content-Length", strconv.Itoa(len(nb)))
}

// errorMessageAt finds error.message in b, an Anthropic error envelope
// ({"type":"error","error":{...,"message":"..."}}): the offsets of its JSON
// string literal and its value. ok is false for anything else, and for an
// envelope with "error" or "message" twice (parsers keep the last one, so
// naming the first would name the copy a client ignores).
func errorMessageAt(b []byte) (start, end int, msg string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	isError, found, errorKeys := false, false, 0
	object := func(each func(key string) error) error {
		if t, err := dec.Token(); err != nil || t != json.Delim('{') {
			return errors.New("not an object")
		}
		for dec.More() {
			t, err := dec.Token()
			if err != nil {
				return err
			}
			if err := each(t.(string)); err != nil {
				return err
			}
		}
		_, err := dec.Token() // the closing brace
		return err
	}
	skip := func() error { var v json.RawMessage; return dec.Decode(&v) }
	err := object(func(key string) error {
		switch key {
		case "type":
			var t string
			if err := dec.Decode(&t); err != nil {
				return err
			}
			isError = t == "error"
			return nil
		case "error":
			if errorKeys++; errorKeys > 1 {
				return errors.New(`"error" twice`)
			}
			return object(func(key string) error {
				if key != "message" {
					return skip()
				}
				if found {
					return errors.New(`"message" twice`)
				}
				var raw json.RawMessage
				if err := dec.Decode(&raw); err != nil {
					return err
				}
				if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &msg) != nil {
					return errors.New("message is not a string")
				}
				end = int(dec.InputOffset())
				start = end - len(raw)
				found = true
				return nil
			})
		}
		return skip()
	})
	if err != nil || !isError || !found {
		return 0, 0, "", false
	}
	return start, end, msg, true
}
