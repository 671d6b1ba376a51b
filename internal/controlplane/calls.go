package controlplane

import (
	"net/http"
	"slices"
	"strings"

	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/httpapi"
)

// bookedCallJSON is one call of GET /api/conversations/{id}/calls: what the
// gateway booked for it (docs/browser-api.md §2.2b).
type bookedCallJSON struct {
	RequestID        string `json:"request_id"`
	Model            string `json:"model"`
	Outcome          string `json:"outcome"`
	BookedNanoUSD    int64  `json:"booked_nano_usd"`
	BookedUSD        string `json:"booked_usd"`
	InputTokens      int64  `json:"input_tokens"`
	OutputTokens     int64  `json:"output_tokens"`
	CacheWriteTokens int64  `json:"cache_write_tokens"`
	CacheReadTokens  int64  `json:"cache_read_tokens"`
}

// listCalls answers GET /api/conversations/{id}/calls?request_id=…: the
// booked calls of the caller's conversation among the given request ids (a
// turn's request_ids), so a client can show what each turn was booked.
// Errors: 400 (no request_id, more than MaxBookedCallsQuery, or a malformed
// one), 401, 404 (not the caller's conversation).
func (s *Server) listCalls(w http.ResponseWriter, r *http.Request) error {
	u, err := s.user(r)
	if err != nil {
		return err
	}
	c, err := s.conversation(r, u) // the owner only; others get 404
	if err != nil {
		return err
	}
	q := r.URL.Query()
	for k := range q {
		if k != "request_id" {
			return httpapi.BadRequest("unknown parameter %q (only request_id)", k)
		}
	}
	ids := q["request_id"]
	if len(ids) == 0 {
		return httpapi.BadRequest("request_id is required: one or more, the request_ids of a turn_completed or turn_failed event")
	}
	if len(ids) > controlstore.MaxBookedCallsQuery {
		return httpapi.BadRequest("at most %d request_id values", controlstore.MaxBookedCallsQuery)
	}
	for _, id := range ids {
		if !validRequestID(id) {
			return httpapi.BadRequest("request_id must be 1-128 characters of [A-Za-z0-9_-]")
		}
	}
	slices.Sort(ids)
	calls, err := s.db.BookedCalls(r.Context(), c.ID, slices.Compact(ids))
	if err != nil {
		return err
	}
	out := struct {
		Calls []bookedCallJSON `json:"calls"`
	}{Calls: []bookedCallJSON{}}
	for _, b := range calls {
		out.Calls = append(out.Calls, bookedCallJSON{RequestID: b.RequestID, Model: b.Model, Outcome: b.Outcome,
			BookedNanoUSD: b.AmountNano, BookedUSD: budget.FormatUSD(b.AmountNano), InputTokens: b.InputTokens,
			OutputTokens: b.OutputTokens, CacheWriteTokens: b.CacheWriteTokens, CacheReadTokens: b.CacheReadTokens})
	}
	slices.SortFunc(out.Calls, func(a, b bookedCallJSON) int { return strings.Compare(a.RequestID, b.RequestID) })
	httpapi.WriteJSON(w, http.StatusOK, out)
	return nil
}

// validRequestID accepts the request ids upstreams and the gateway use.
func validRequestID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
