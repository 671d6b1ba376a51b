package gateway

import (
	"context"
	"io"
	"net/http"

	"github.com/talkide/talkide/internal/httpapi"
)

// CheckUpstream reports whether the model upstream resolves, answers over
// the gateway's own transport and takes the API key: it lists the
// upstream's models with the key (GET /v1/models, free at Anthropic), and
// any answer but 401 counts. Otherwise it returns an *UpstreamError naming
// the cause: unreachable (DNS, refused, TLS, timeout), or KeyRefused with
// the upstream's reason. ctx bounds the check. A 401 is also kept as the
// refusal later calls are answered with; any other answer clears it.
func (h *Handler) CheckUpstream(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, httpapi.JoinURL(h.cfg.Upstream, "/v1/models").String()+"?limit=1", nil)
	if err != nil {
		return &UpstreamError{Upstream: h.cfg.Upstream.Redacted(), Cause: "invalid URL: " + err.Error(), Unreachable: true, Err: err}
	}
	req.Header.Set("Anthropic-Version", anthropicVersion)
	if h.cfg.APIKey != "" {
		req.Header.Set("X-Api-Key", h.cfg.APIKey)
	}
	resp, err := h.cfg.Transport.RoundTrip(req)
	if err != nil {
		return describeUpstreamError(h.cfg.Upstream, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		h.refusal.Store(nil)
		return nil
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxKeyRefusalBody))
	ue := keyRefusalError(h, resp.StatusCode, b)
	h.refusal.Store(ue)
	return ue
}
