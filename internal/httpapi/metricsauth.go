package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
)

// MetricsAuth guards a metrics handler with a bearer token: the request
// must carry "Authorization: Bearer <token>" with one of tokens (empty ones
// are ignored). With no token configured every request is refused with 403
// naming TALKIDE_METRICS_TOKEN; a missing or wrong token is 401. Loopback
// clients get no exception: on one machine an agent is a loopback client
// too, and metrics name tenants, users' activity and spend.
func MetricsAuth(next http.Handler, tokens ...string) HandlerFunc {
	var sums [][32]byte
	for _, t := range tokens {
		if t != "" {
			sums = append(sums, sha256.Sum256([]byte(t)))
		}
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		if len(sums) == 0 {
			return Forbidden("metrics are disabled: set TALKIDE_METRICS_TOKEN and send it as Authorization: Bearer <token>", nil)
		}
		raw := BearerToken(r)
		got := sha256.Sum256([]byte(raw))
		ok := 0
		for _, s := range sums {
			ok |= subtle.ConstantTimeCompare(got[:], s[:])
		}
		if raw == "" || ok != 1 {
			return Unauthorized("missing or wrong metrics token (Authorization: Bearer <TALKIDE_METRICS_TOKEN>)", nil)
		}
		next.ServeHTTP(w, r)
		return nil
	}
}
