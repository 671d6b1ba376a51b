package controlplane

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/controlplane/budget"
)

// TestBudgetAdminAPIRefusesInputItWouldTakeSilently guards a first-run
// fault found from outside: period=garbage, 2026-13 and 2026-02-31 answered 200
// with nothing spent, and kind=bogus an empty ledger. Every such input is a
// 400 invalid_request in the platform's error shape, naming the parameter,
// and changes nothing.
func TestBudgetAdminAPIRefusesInputItWouldTakeSilently(t *testing.T) {
	f := startControlPlane(t, "", adminToken)
	if st, b := f.do(t, "PUT", "/api/admin/budget/users/alice/limit", adminToken, `{"limit_usd":"7"}`); st != 200 {
		t.Fatalf("set limit: %d %s", st, b)
	}
	for _, tc := range []struct{ method, path, body, names string }{
		{"GET", "/api/admin/budget/users/alice?period=garbage", "", "period"},
		{"GET", "/api/admin/budget/users/alice?period=2026-13", "", "period"},
		{"GET", "/api/admin/budget/users/alice?period=2026-02-31", "", "period"},
		{"GET", "/api/admin/budget/users/alice?period=2026-1", "", "period"},
		{"GET", "/api/admin/budget/users/alice?period=", "", "period"},
		{"GET", "/api/admin/budget/users/alice?period=2026-W48", "", "period"}, // a week, but periods here are months
		{"GET", "/api/admin/budget/users/alice?period=2026-11-30", "", "period"},
		{"GET", "/api/admin/budget/users/alice?perod=2026-11", "", "perod"},
		{"GET", "/api/admin/budget/users/alice?period=2026-11&period=2026-10", "", "period"},
		{"GET", "/api/admin/budget/users/alice?tenant=Not_A_Tenant", "", "tenant"},
		{"GET", "/api/admin/budget/users/" + url.PathEscape(" alice"), "", "user"},
		{"GET", "/api/admin/budget/users/" + url.PathEscape("al\x00ice"), "", "user"},
		{"GET", "/api/admin/budget/users/" + strings.Repeat("u", 129), "", "user"},
		{"PUT", "/api/admin/budget/users/" + url.PathEscape("bob\n") + "/limit", `{"limit_usd":"1"}`, "user"},
		{"DELETE", "/api/admin/budget/users/" + url.PathEscape("\talice") + "/limit", "", "user"},
		{"PUT", "/api/admin/budget/tenants/ACME/limit", `{"limit_usd":"1"}`, "tenant"},
		{"DELETE", "/api/admin/budget/tenants/-acme/limit", "", "tenant"},
		{"GET", "/api/admin/budget/ledger?kind=bogus", "", "kind"},
		{"GET", "/api/admin/budget/ledger?kind=", "", "kind"},
		{"GET", "/api/admin/budget/ledger?kinds=debit", "", "kinds"},
		{"GET", "/api/admin/budget/ledger?user=", "", "user"},
		{"GET", "/api/admin/budget/ledger?conversation=" + url.QueryEscape("../x"), "", "conversation"},
		{"GET", "/api/admin/budget/ledger?limit=0", "", "limit"},
		{"GET", "/api/admin/budget/ledger?limit=10001", "", "limit"},
		{"GET", "/api/admin/budget/ledger?limit=5x", "", "limit"},
		{"GET", "/api/admin/budget/ledger?since=yesterday", "", "since"},
		{"GET", "/api/admin/budget/ledger?since=2026-11-30T00:00:00Z&until=2026-11-01T00:00:00Z", "", "since"},
	} {
		st, b := f.do(t, tc.method, tc.path, adminToken, tc.body)
		var eb contract.ErrorBody
		if err := json.Unmarshal(b, &eb); st != 400 || err != nil || eb.Error.Type != contract.ErrTypeInvalidRequest || !strings.Contains(eb.Error.Message, tc.names) {
			t.Errorf("%s %s: got %d %s, want 400 invalid_request naming %q", tc.method, tc.path, st, b, tc.names)
		}
	}
	// Nothing refused changed anything: alice keeps her limit, no tenant
	// limit was set.
	var sp spendJSON
	_, b := f.do(t, "GET", "/api/admin/budget/users/alice?tenant=acme", adminToken, "")
	if json.Unmarshal(b, &sp); sp.LimitUSD != "7" || sp.LimitSource != "user" {
		t.Errorf("after the refusals: got %s, want alice's own limit of 7", b)
	}
	_, b = f.do(t, "GET", "/api/admin/budget/users/carol?tenant=acme", adminToken, "")
	if json.Unmarshal(b, &sp); sp.LimitSource != "default" {
		t.Errorf("after the refusals: got %s, want no tenant limit on acme", b)
	}
	// Well-formed input still answers.
	for _, path := range []string{
		"/api/admin/budget/users/alice?period=2026-11",
		"/api/admin/budget/users/alice?period=2024-02&tenant=acme",
		"/api/admin/budget/users/" + url.PathEscape("Alice Smith@example.com"),
		"/api/admin/budget/ledger?kind=debit&user=alice&limit=10000",
		"/api/admin/budget/ledger?kind=reserve&conversation=conv-1&since=2026-11-01T00:00:00Z&until=2026-12-01T00:00:00Z",
	} {
		if st, b := f.do(t, "GET", path, adminToken, ""); st != 200 {
			t.Errorf("GET %s: got %d %s, want 200", path, st, b)
		}
	}
}

func TestCheckPeriodFollowsTheCalendar(t *testing.T) {
	for _, tc := range []struct {
		kind budget.PeriodKind
		p    string
		ok   bool
	}{
		{budget.Monthly, "2026-12", true},
		{budget.Monthly, "2026-00", false},
		{budget.Daily, "2024-02-29", true},
		{budget.Daily, "2026-02-29", false},
		{budget.Daily, "2026-2-28", false},
		{budget.Weekly, "2026-W01", true},
		{budget.Weekly, "2026-W53", true}, // 2026 has 53 ISO weeks
		{budget.Weekly, "2025-W53", false},
		{budget.Weekly, "2026-W00", false},
		{budget.Weekly, "2026-W1", false},
		{budget.Weekly, "2026-W48x", false},
		{budget.Weekly, "2026-11", false},
	} {
		if err := checkPeriod(tc.kind, tc.p); (err == nil) != tc.ok {
			t.Errorf("checkPeriod(%s, %q): got %v, want ok=%v", tc.kind, tc.p, err, tc.ok)
		}
	}
}
