package devupstream

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// APIError is an HTTP error answer in Anthropic's error envelope:
//
//	{"type":"error","error":{"type":<Type>,"message":<Message>[,"details":<Details>]},"request_id":"req_dev_…"}
//
// It is both what a scripted [Response] uses to fail a call and the error
// the server's own handlers return (400 for a malformed request, 401, 404,
// 405, 413). Zero fields get defaults: Status from Type (or 500), Type from
// Status (see the table in Anthropic's error documentation), Message from
// the status text.
type APIError struct {
	Status  int    `json:"status,omitempty"`  // HTTP status, e.g. 429 or 529
	Type    string `json:"type,omitempty"`    // error.type, e.g. "rate_limit_error"
	Message string `json:"message,omitempty"` // error.message, safe to show clients
	// Header holds extra response headers, e.g. {"retry-after": "2"} (seconds)
	// or {"x-should-retry": "false"}.
	Header map[string]string `json:"headers,omitempty"`
	// Details, when set, is copied verbatim into error.details, e.g.
	// {"error_code":"enforced_spend_limit_reached"}.
	Details json.RawMessage `json:"details,omitempty"`
}

// Error returns "<status> <type>: <message>" with defaults applied.
func (e *APIError) Error() string {
	n := e.normalized()
	return strconv.Itoa(n.Status) + " " + n.Type + ": " + n.Message
}

// errorTypes maps HTTP statuses to Anthropic error types and back.
var errorTypes = []struct {
	status int
	typ    string
}{
	{http.StatusBadRequest, "invalid_request_error"},
	{http.StatusUnauthorized, "authentication_error"},
	{http.StatusPaymentRequired, "billing_error"},
	{http.StatusForbidden, "permission_error"},
	{http.StatusNotFound, "not_found_error"},
	{http.StatusRequestEntityTooLarge, "request_too_large"},
	{http.StatusTooManyRequests, "rate_limit_error"},
	{http.StatusInternalServerError, "api_error"},
	{http.StatusGatewayTimeout, "timeout_error"},
	{529, "overloaded_error"},
}

// normalized returns a copy with every default filled in.
func (e *APIError) normalized() *APIError {
	out := *e
	if out.Status == 0 {
		out.Status = http.StatusInternalServerError
		for _, et := range errorTypes {
			if et.typ == out.Type {
				out.Status = et.status
				break
			}
		}
	}
	if out.Type == "" {
		out.Type = "api_error"
		if out.Status >= 400 && out.Status < 500 {
			out.Type = "invalid_request_error"
		}
		for _, et := range errorTypes {
			if et.status == out.Status {
				out.Type = et.typ
				break
			}
		}
	}
	if out.Message == "" {
		out.Message = http.StatusText(out.Status)
		if out.Status == 529 {
			out.Message = "Overloaded"
		}
		if out.Message == "" {
			out.Message = "Error"
		}
	}
	return &out
}

// invalidRequest is a 400 invalid_request_error with a client-safe message.
func invalidRequest(msg string) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: msg}
}

// errorBody is the JSON of an error, both as a response body (with
// RequestID) and as an SSE error event (without).
type errorBody struct {
	Type      string      `json:"type"` // always "error"
	Error     errorDetail `json:"error"`
	RequestID string      `json:"request_id,omitempty"`
}

type errorDetail struct {
	Type    string          `json:"type"`
	Message string          `json:"message"`
	Details json.RawMessage `json:"details,omitempty"`
}

// writeAPIError answers with e in the error envelope. The request-id
// header is already set by ServeHTTP.
func writeAPIError(w http.ResponseWriter, e *APIError, requestID string) {
	e = e.normalized()
	body, err := marshal(errorBody{
		Type:      "error",
		Error:     errorDetail{Type: e.Type, Message: e.Message, Details: e.Details},
		RequestID: requestID,
	})
	if err != nil {
		// Only Details can fail to marshal (invalid raw JSON); drop it.
		body, _ = marshal(errorBody{Type: "error", Error: errorDetail{Type: e.Type, Message: e.Message}, RequestID: requestID})
	}
	for k, v := range e.Header {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(body)
}
