// Package anthropic holds the pieces of the Anthropic Messages API wire format
// that the platform's proxies need: the error envelope and its types
// (Anthropic API errors documentation; httpapi.AnthropicBody writes it), usage accounting over a Messages stream or answer
// (StreamMeter, ParseMessageUsage: message_start / message_delta usage, set
// not added, error events, an estimate of delivered output, and why usage
// that cannot settle a call is unreadable) and the fast scan
// of a request's model and max_tokens (ScanRequestHead).
//
// It is not a client SDK and does not model requests beyond what budgeting
// needs. The development upstream has its own, fuller model of requests.
package anthropic

// Error types of the Anthropic error envelope.
const (
	ErrInvalidRequest = "invalid_request_error" // 400
	ErrAuthentication = "authentication_error"  // 401
	ErrBilling        = "billing_error"         // 402
	ErrPermission     = "permission_error"      // 403
	ErrNotFound       = "not_found_error"       // 404
	ErrTooLarge       = "request_too_large"     // 413
	ErrRateLimit      = "rate_limit_error"      // 429
	ErrAPI            = "api_error"             // 500
	ErrTimeout        = "timeout_error"         // 504
	ErrOverloaded     = "overloaded_error"      // 529
)

// ErrorEnvelope is Anthropic's error body:
//
//	{"type":"error","error":{"type":"rate_limit_error","message":"..."},"request_id":"req_..."}
type ErrorEnvelope struct {
	Type      string      `json:"type"`
	Error     ErrorDetail `json:"error"`
	RequestID string      `json:"request_id,omitempty"`
}

// ErrorDetail is the inside of ErrorEnvelope. Details carries extra
// machine-readable data (e.g. {"error_code":"budget_exceeded"}).
type ErrorDetail struct {
	Type    string         `json:"type"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}
