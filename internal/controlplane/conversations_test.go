package controlplane

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/controlplane/controlstore"
	"github.com/talkide/talkide/internal/pgtest"
)

type listedConversation struct {
	ID                 string    `json:"id"`
	Tenant             string    `json:"tenant"`
	Env                string    `json:"env"`
	Title              string    `json:"title"`
	TitleSet           bool      `json:"title_set"`
	CreatedAt          time.Time `json:"created_at"`
	LastActivityAt     time.Time `json:"last_activity_at"`
	State              string    `json:"state"`
	PendingPermissions int       `json:"pending_permissions"`
	SpentNanoUSD       int64     `json:"spent_nano_usd"`
	SpentUSD           string    `json:"spent_usd"`
}

type conversationPage struct {
	Conversations []listedConversation `json:"conversations"`
	NextCursor    string               `json:"next_cursor"`
}

// seedUser stores user id with token tok and the grant acme/dev.
func seedUser(t *testing.T, db *controlstore.DB, id, tok string) {
	t.Helper()
	if err := db.UpsertUser(t.Context(), controlstore.User{ID: id, TokenHash: controlstore.HashUserToken(tok)}, [2]string{"acme", "dev"}); err != nil {
		t.Fatal(err)
	}
}

// activity stores one reported event of conv, as the reporting endpoint does.
func activity(t *testing.T, db *controlstore.DB, conv string, id int64, typ, summary, ref string, at time.Time) {
	t.Helper()
	_, err := db.SQL.ExecContext(t.Context(), db.Q(`INSERT INTO activity_log (conversation_id, event_id, tenant, env, type, summary, at, received_at, ref)
		VALUES (?, ?, 'acme', 'dev', ?, ?, ?, ?, ?)`), conv, id, typ, summary, at.UnixMilli(), at.UnixMilli(), ref)
	if err != nil {
		t.Fatal(err)
	}
}

func (f *cpFixture) page(t *testing.T, tok, query string) conversationPage {
	t.Helper()
	code, body := f.do(t, "GET", "/api/conversations"+query, tok, "")
	if code != http.StatusOK {
		t.Fatalf("GET /api/conversations%s: %d %s", query, code, body)
	}
	var p conversationPage
	if err := json.Unmarshal(body, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConversationListSQLite(t *testing.T) {
	testConversationList(t, startControlPlane(t, "", adminToken))
}

func TestConversationListPostgres(t *testing.T) {
	testConversationList(t, startControlPlane(t, pgtest.SchemaURL(t), adminToken))
}

func testConversationList(t *testing.T, f *cpFixture) {
	db := f.db
	seedUser(t, db, "ann", "tok-ann")
	seedUser(t, db, "bob", "tok-bob")
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond).UTC()
	var ids []string
	for i := range 5 {
		id := fmt.Sprintf("conv-%d", i)
		ids = append(ids, id)
		if err := db.CreateConversation(t.Context(), controlstore.Conversation{ID: id, Tenant: "acme", Env: "dev", UserID: "ann", CreatedAt: base.Add(time.Duration(i) * time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	// Same creation time as conv-4: the id breaks the tie, and paging
	// neither repeats nor skips it.
	if err := db.CreateConversation(t.Context(), controlstore.Conversation{ID: "conv-5", Tenant: "acme", Env: "dev", UserID: "ann", CreatedAt: base.Add(4 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateConversation(t.Context(), controlstore.Conversation{ID: "bobs", Tenant: "acme", Env: "dev", UserID: "bob", CreatedAt: base}); err != nil {
		t.Fatal(err)
	}
	if err := db.CreateConversation(t.Context(), controlstore.Conversation{ID: "gone", Tenant: "acme", Env: "dev", UserID: "ann", CreatedAt: base.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := db.DeleteConversation(t.Context(), "gone", time.Now()); err != nil {
		t.Fatal(err)
	}

	// Pages of 2, newest first, ties by id, only ann's live ones.
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		q := "?limit=2"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		p := f.page(t, "tok-ann", q)
		for _, c := range p.Conversations {
			got = append(got, c.ID)
		}
		if p.NextCursor == "" {
			break
		}
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		cursor = p.NextCursor
	}
	if want := "conv-5 conv-4 conv-3 conv-2 conv-1 conv-0"; strings.Join(got, " ") != want {
		t.Fatalf("listed %v, want %s", got, want)
	}
	if p := f.page(t, "tok-bob", ""); len(p.Conversations) != 1 || p.Conversations[0].ID != "bobs" {
		t.Fatalf("bob sees %+v", p)
	}
	if p := f.page(t, "tok-ann", "?tenant=other"); len(p.Conversations) != 0 {
		t.Fatalf("another tenant lists %+v", p)
	}

	// What the reports say: the first message is the title, a turn in
	// progress is "running", a request raised again counts once and only
	// until it is resolved after it.
	c := ids[2]
	activity(t, db, c, 1, "user_message", "user: please   fix\nthe build", "", base.Add(10*time.Minute))
	activity(t, db, c, 2, "turn_started", "turn started", "", base.Add(11*time.Minute))
	activity(t, db, c, 3, "permission_requested", "permission: Bash", "req-a", base.Add(12*time.Minute))
	activity(t, db, c, 4, "permission_requested", "permission: Bash", "req-b", base.Add(12*time.Minute))
	activity(t, db, c, 5, "permission_resolved", "allow", "req-b", base.Add(13*time.Minute))
	activity(t, db, c, 6, "permission_requested", "permission: Bash (again)", "req-a", base.Add(14*time.Minute))
	activity(t, db, c, 7, "user_message", "user: second message", "", base.Add(15*time.Minute))
	one := func() listedConversation {
		t.Helper()
		code, body := f.do(t, "GET", "/api/conversations?limit=100", "tok-ann", "")
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		var p conversationPage
		json.Unmarshal(body, &p)
		for _, x := range p.Conversations {
			if x.ID == c {
				return x
			}
		}
		t.Fatalf("%s not listed", c)
		return listedConversation{}
	}
	x := one()
	if x.Title != "please fix the build" || x.TitleSet || x.State != "running" || x.PendingPermissions != 1 ||
		!x.LastActivityAt.Equal(base.Add(15*time.Minute)) || !x.CreatedAt.Equal(base.Add(2*time.Minute)) {
		t.Fatalf("listed %+v", x)
	}
	activity(t, db, c, 8, "permission_resolved", "deny", "req-a", base.Add(16*time.Minute))
	activity(t, db, c, 9, "turn_completed", "done", "", base.Add(17*time.Minute))
	if x := one(); x.State != "idle" || x.PendingPermissions != 0 {
		t.Fatalf("after the turn: %+v", x)
	}

	// Spend: the gateway's debits booked for the conversation.
	if code := f.modelCallIn(t, "ann", c); code != 200 {
		t.Fatalf("model call: %d", code)
	}
	deadline := time.Now().Add(10 * time.Second)
	for one().SpentNanoUSD == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the call's debit never showed in the list")
		}
		time.Sleep(50 * time.Millisecond)
	}
	var debits int64
	if err := db.SQL.QueryRowContext(t.Context(), db.Q(`SELECT SUM(amount_nano) FROM budget_ledger WHERE conversation_id = ? AND kind = 'debit'`), c).Scan(&debits); err != nil {
		t.Fatal(err)
	}
	if x := one(); x.SpentNanoUSD != debits || x.SpentUSD == "" {
		t.Fatalf("spent %d (%s), ledger debits %d", x.SpentNanoUSD, x.SpentUSD, debits)
	}

	// Rename, back to the first message, and what is refused.
	code, body := f.do(t, "PATCH", "/api/conversations/"+c, "tok-ann", `{"title":"  Build fix  "}`)
	var renamed listedConversation
	json.Unmarshal(body, &renamed)
	if code != 200 || renamed.Title != "Build fix" || !renamed.TitleSet || renamed.ID != c {
		t.Fatalf("rename: %d %s", code, body)
	}
	if x := one(); x.Title != "Build fix" {
		t.Fatalf("listed after rename: %+v", x)
	}
	for _, bad := range []string{`{"title":"two\nlines"}`, `{"title":"` + strings.Repeat("x", 201) + `"}`, `{}`, `{"title":5}`, `{"title":"a\u0007"}`, `{"title":"invoice\u202egnp.exe"}`, `{"title":"a\u200bb"}`} {
		if code, body := f.do(t, "PATCH", "/api/conversations/"+c, "tok-ann", bad); code != 400 || !strings.Contains(string(body), `"invalid_request"`) {
			t.Errorf("PATCH %s: %d %s, want 400", bad, code, body)
		}
	}
	if code, _ := f.do(t, "PATCH", "/api/conversations/"+c, "tok-bob", `{"title":"mine"}`); code != 404 {
		t.Errorf("another user's rename: %d, want 404", code)
	}
	if code, _ := f.do(t, "PATCH", "/api/conversations/gone", "tok-ann", `{"title":"back"}`); code != 404 {
		t.Errorf("rename of a deleted conversation: %d, want 404", code)
	}
	if code, body := f.do(t, "PATCH", "/api/conversations/"+c, "tok-ann", `{"title":""}`); code != 200 || !strings.Contains(string(body), `"title":"please fix the build"`) {
		t.Fatalf("rename to \"\": %d %s", code, body)
	}

	// Bad queries get 400 with the reason; no token is 401.
	for _, q := range []string{"?limit=0", "?limit=101", "?limit=x", "?cursor=garbage", "?cursor=" + url.QueryEscape("bm90LWEtY3Vyc29y"), "?tenant=BAD", "?sort=old", "?limit=1&limit=2"} {
		if code, body := f.do(t, "GET", "/api/conversations"+q, "tok-ann", ""); code != 400 || !strings.Contains(string(body), `"invalid_request"`) {
			t.Errorf("GET /api/conversations%s: %d %s, want 400", q, code, body)
		}
	}
	if code, _ := f.do(t, "GET", "/api/conversations", "", ""); code != 401 {
		t.Errorf("no token: %d, want 401", code)
	}
}

func TestMeShowsGrantsAndBudget(t *testing.T) {
	f := startControlPlane(t, "", adminToken)
	seedUser(t, f.db, "ann", "tok-ann")
	if code, body := f.do(t, "PUT", "/api/admin/budget/users/ann/limit", adminToken, `{"limit_usd":"2.50"}`); code != 200 {
		t.Fatalf("set limit: %d %s", code, body)
	}
	code, body := f.do(t, "GET", "/api/me?tenant=acme", "tok-ann", "")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	var me struct {
		User   string `json:"user"`
		Grants []struct{ Tenant, Env string }
		Budget struct {
			Period       string    `json:"period"`
			LimitUSD     string    `json:"limit_usd"`
			RemainingUSD string    `json:"remaining_usd"`
			ResetsAt     time.Time `json:"resets_at"`
		} `json:"budget"`
	}
	if err := json.Unmarshal(body, &me); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	first := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	if me.User != "ann" || len(me.Grants) != 1 || me.Grants[0].Tenant != "acme" || me.Grants[0].Env != "dev" ||
		me.Budget.LimitUSD != "2.5" || me.Budget.RemainingUSD != "2.5" || me.Budget.Period != now.Format("2006-01") || !me.Budget.ResetsAt.Equal(first) {
		t.Fatalf("me: %s", body)
	}
	if code, _ := f.do(t, "GET", "/api/me", "wrong", ""); code != 401 {
		t.Errorf("wrong token: %d", code)
	}
	if code, _ := f.do(t, "GET", "/api/me?tenant=A!", "tok-ann", ""); code != 400 {
		t.Errorf("bad tenant: %d", code)
	}
	if code, body := f.do(t, "GET", "/api/me?tenant=other", "tok-ann", ""); code != 403 || !strings.Contains(string(body), `"forbidden"`) {
		t.Errorf("a tenant without a grant: %d %s, want 403", code, body)
	}
}
