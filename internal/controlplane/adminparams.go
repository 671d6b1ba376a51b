package controlplane

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/httpapi"
)

// The admin API's input checks. A parameter the API would otherwise take
// silently (a period that cannot exist, a ledger kind that no entry has, a
// misspelt query parameter) is a 400 invalid_request naming it, never an
// empty 200.

// ledgerKinds are the kinds of budget ledger entries (docs/budget-admin-api.md).
var ledgerKinds = []string{"reserve", "debit", "expire", "refund"}

// maxLedgerLimit is the most entries one ledger query returns.
const maxLedgerLimit = 10000

// onlyParams refuses query parameters other than allowed (and a parameter
// given twice), so a misspelt filter is an error rather than no filter.
func onlyParams(q url.Values, allowed ...string) error {
	var unknown []string
	for k, vs := range q {
		if !slices.Contains(allowed, k) {
			unknown = append(unknown, k)
			continue
		}
		if len(vs) > 1 {
			return httpapi.BadRequest("query parameter %q given %d times: give it once", k, len(vs))
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return httpapi.BadRequest("unknown query parameter %q: this endpoint takes %s", unknown[0], strings.Join(allowed, ", "))
	}
	return nil
}

// userParam returns the path's {user}, or a 400 when it cannot name a user.
func userParam(r *http.Request) (string, error) {
	u := r.PathValue("user")
	if !controlstore.ValidUserID(u) {
		return "", httpapi.BadRequest("user %q: want 1-%d bytes of UTF-8 without control characters or surrounding spaces", u, controlstore.MaxUserIDBytes)
	}
	return u, nil
}

// tenantParam checks an optional tenant name ("" is no tenant).
func tenantParam(name, v string) error {
	if v != "" && !validName(v) {
		return httpapi.BadRequest("%s %q: want 1-30 characters of [a-z0-9-], not starting or ending with -", name, v)
	}
	return nil
}

// checkPeriod checks that p is a period of kind k that exists on the
// calendar: "2026-11" (month), "2026-W48" (ISO week, 01 to 52 or 53) or
// "2026-11-30" (day). Periods of another kind than the control plane's
// [TALKIDE_BUDGET_PERIOD] hold no spend, so they are refused too.
func checkPeriod(k budget.PeriodKind, p string) error {
	var ok bool
	var example string
	switch k {
	case budget.Daily:
		t, err := time.Parse(time.DateOnly, p)
		ok, example = err == nil && t.Format(time.DateOnly) == p, "2026-11-30"
	case budget.Weekly:
		var y, w int
		var rest string
		n, _ := fmt.Sscanf(p, "%4d-W%2d%s", &y, &w, &rest)
		if n == 2 && y >= 1 && w >= 1 {
			ok = budget.Weekly.Key(isoWeekMonday(y, w)) == p
		}
		example = "2026-W48"
	default:
		t, err := time.Parse("2006-01", p)
		ok, example = err == nil && t.Format("2006-01") == p, "2026-11"
	}
	if !ok {
		return httpapi.BadRequest("period %q: not a %s of the calendar; budget periods here are %ss, like %s", p, k, k, example)
	}
	return nil
}

// periodStart returns the first instant of period p of kind k (p must have
// passed checkPeriod).
func periodStart(k budget.PeriodKind, p string) time.Time {
	switch k {
	case budget.Daily:
		t, _ := time.Parse(time.DateOnly, p)
		return t
	case budget.Weekly:
		var y, w int
		fmt.Sscanf(p, "%4d-W%2d", &y, &w)
		return isoWeekMonday(y, w)
	}
	t, _ := time.Parse("2006-01", p)
	return t
}

// isoWeekMonday returns the Monday of ISO week w of year y (week 1 holds
// January 4th). A week past the year's last one falls in the next year.
func isoWeekMonday(y, w int) time.Time {
	jan4 := time.Date(y, time.January, 4, 0, 0, 0, 0, time.UTC)
	back := (int(jan4.Weekday()) + 6) % 7 // days since Monday
	return jan4.AddDate(0, 0, -back+(w-1)*7)
}

// ledgerQuery reads and checks the ledger's query parameters.
func ledgerQuery(q url.Values) (budget.LedgerQuery, error) {
	if err := onlyParams(q, "user", "conversation", "kind", "since", "until", "limit"); err != nil {
		return budget.LedgerQuery{}, err
	}
	lq := budget.LedgerQuery{UserID: q.Get("user"), ConversationID: q.Get("conversation"), Kind: q.Get("kind")}
	if q.Has("user") && !controlstore.ValidUserID(lq.UserID) {
		return lq, httpapi.BadRequest("user %q: want 1-%d bytes of UTF-8 without control characters or surrounding spaces", lq.UserID, controlstore.MaxUserIDBytes)
	}
	if q.Has("conversation") && contract.ValidConversationID(lq.ConversationID) != nil {
		return lq, httpapi.BadRequest("conversation %q: want a conversation id (1-64 characters of [A-Za-z0-9_-])", lq.ConversationID)
	}
	if q.Has("kind") && !slices.Contains(ledgerKinds, lq.Kind) {
		return lq, httpapi.BadRequest("kind %q: want one of %s", lq.Kind, strings.Join(ledgerKinds, ", "))
	}
	for name, dst := range map[string]*time.Time{"since": &lq.Since, "until": &lq.Until} {
		if q.Has(name) {
			t, err := time.Parse(time.RFC3339, q.Get(name))
			if err != nil {
				return lq, httpapi.BadRequest("%s %q: want an RFC 3339 time like 2026-11-30T20:00:00Z", name, q.Get(name))
			}
			*dst = t
		}
	}
	if !lq.Since.IsZero() && !lq.Until.IsZero() && !lq.Since.Before(lq.Until) {
		return lq, httpapi.BadRequest("since (%s) must be before until (%s)", q.Get("since"), q.Get("until"))
	}
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > maxLedgerLimit {
			return lq, httpapi.BadRequest("limit %q: want an integer from 1 to %d", q.Get("limit"), maxLedgerLimit)
		}
		lq.Limit = n
	}
	return lq, nil
}
