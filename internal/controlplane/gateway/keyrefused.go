package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"unicode"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/httpapi"
)

// maxKeyRefusalBody bounds how much of the upstream's 401 answer is read.
const maxKeyRefusalBody = 64 << 10

// keyRefusedAdvice ends every message about a refused key: the one person
// who can fix it.
const keyRefusedAdvice = "Ask the platform's administrator to set a valid Anthropic API key (ANTHROPIC_API_KEY of the control plane)."

// keyRefused turns the upstream's 401 to a forwarded call into the
// gateway's own answer. The credential the upstream refused is this
// control plane's API key (the caller's WorkerToken was checked before
// forwarding), so retrying cannot help and the agent must not read it as
// its own login ("Not logged in · Please run /login", after ten retries
// over three minutes): the answer is 502 api_error with x-should-retry:
// false, whose message says the key was refused and quotes the upstream's
// reason. The refusal is remembered for CheckUpstream (readiness) until a
// call succeeds, and logged at ERROR.
func (h *Handler) keyRefused(resp *http.Response, c *call) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxKeyRefusalBody))
	resp.Body.Close()
	ue := keyRefusalError(h, resp.StatusCode, b)
	h.refusal.Store(ue)
	h.log.ErrorContext(resp.Request.Context(), "model upstream refused the API key", "upstream", ue.Upstream,
		"cause", ue.Cause, "request_id", c.requestID, "upstream_request_id", resp.Header.Get("Request-Id"))
	body, _ := json.Marshal(anthropic.ErrorEnvelope{Type: "error", RequestID: c.requestID, Error: anthropic.ErrorDetail{
		Type:    anthropic.ErrAPI,
		Message: httpapi.NamedMessage("TalkIDE gateway: "+ue.Error()+". "+keyRefusedAdvice, c.requestID),
	}})
	resp.StatusCode, resp.Status = http.StatusBadGateway, "502 Bad Gateway"
	for _, k := range []string{"Content-Encoding", "Content-Length", "Www-Authenticate", "Retry-After"} {
		resp.Header.Del(k)
	}
	resp.Header.Set("Content-Type", "application/json")
	resp.Header.Set("X-Should-Retry", "false")
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.ContentLength = int64(len(body))
	resp.Body = io.NopCloser(bytes.NewReader(body))
}

// keyRefusalError describes the upstream's refusal of the key: its status,
// and the type and message of its error envelope (printable, at most 200
// characters: the upstream's words reach the user).
func keyRefusalError(h *Handler, status int, body []byte) *UpstreamError {
	cause := strconv.Itoa(status)
	var env anthropic.ErrorEnvelope
	if json.Unmarshal(body, &env) == nil {
		if t := printable(env.Error.Type, 60); t != "" {
			cause += " " + t
		}
		if m := printable(env.Error.Message, 200); m != "" {
			// The CLI turns any API error whose text holds "x-api-key"
			// into "Not logged in · Please run /login" (Claude Code
			// 2.1.332), hiding the message: the header is named in
			// other words.
			cause += ": " + apiKeyHeader.ReplaceAllString(m, "API key")
		}
	}
	return &UpstreamError{Upstream: h.cfg.Upstream.Redacted(), Cause: cause, KeyRefused: true}
}

// apiKeyHeader matches the header's name in the upstream's words.
var apiKeyHeader = regexp.MustCompile(`(?i)x-api-key`)

// printable is s without control characters, cut to at most n runes.
func printable(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.TrimSpace(s))
	if r := []rune(s); len(r) > n {
		s = string(r[:n]) + "…"
	}
	return s
}

// anthropicVersion is the API version the key check names.
const anthropicVersion = "2023-06-01"
