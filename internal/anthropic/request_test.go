package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var ignoreAt = cmpopts.IgnoreUnexported(RequestHead{})

func TestScanRequestHead(t *testing.T) {
	cases := []struct {
		in   string
		want RequestHead
	}{
		{`{"model":"claude-x","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, RequestHead{Model: "claude-x", MaxTokens: 1024, Stream: true}},
		{` { "messages" : [ {"content":[{"type":"text","text":"\"max_tokens\":9 }"}]} ], "max_tokens" : 7 , "model":"m\u00e9" } `, RequestHead{Model: "mé", MaxTokens: 7}},
		{`{"metadata":{"nested":{"max_tokens":99,"model":"no"}},"max_tokens":3}`, RequestHead{MaxTokens: 3}},
		{`{"model":null,"max_tokens":null,"stream":null,"tools":null,"thinking":null,"mcp_servers":null}`, RequestHead{}},
		{`{}`, RequestHead{}},
		// Escapes before a quote: an even run of backslashes ends the string, an odd one does not.
		{`{"messages":"a\\","model":"m","system":"x\\\"\"y\\\\","max_tokens":2}`, RequestHead{Model: "m", MaxTokens: 2}},
		{`{"messages":"\",\"model\":\"fake\"","model":"real"}`, RequestHead{Model: "real"}},
		{`{"metadata":{"a":[1,2.5e3,-1,true,false,null,"x"]},"stream":false,"max_tokens":-5}`, RequestHead{MaxTokens: -5}},
		// Escaped names of members nobody prices are fine.
		{`{"me\u0074adata":{},"max_tokens":1}`, RequestHead{MaxTokens: 1}},
		{`{"max_tokens":64,"thinking":{"type":"enabled","budget_tokens":32},"tools":[` +
			`{"name":"Bash","input_schema":{"type":"object","properties":{"type":{"type":"string"}}}},` +
			`{"type":"custom","name":"c","input_schema":{}},{"type":"bash_20250124","name":"bash"},{"type":"text_editor_20250728","name":"e"},` +
			`{"type":"web_search_20250305","name":"web_search","max_uses":5},{"type":"web_fetch_20250910","name":"web_fetch","max_content_tokens":9000},` +
			`{"type":"code_execution_20250825","name":"code_execution"}],"mcp_servers":[{"type":"url","url":"https://x"},{"type":"url","url":"https://y"}]}`,
			RequestHead{MaxTokens: 64, ThinkingBudget: 32, MCPServers: 2, ServerTools: []ServerTool{
				{Type: "web_search_20250305", MaxUses: 5}, {Type: "web_fetch_20250910", MaxContentTokens: 9000}, {Type: "code_execution_20250825"}}}},
	}
	for _, tc := range cases {
		got, err := ScanRequestHead([]byte(tc.in))
		if err != nil {
			t.Errorf("ScanRequestHead(%s): %v", tc.in, err)
			continue
		}
		if d := cmp.Diff(tc.want, got, ignoreAt); d != "" {
			t.Errorf("ScanRequestHead(%s) (-want +got):\n%s", tc.in, d)
		}
	}
	for _, bad := range []string{``, `not json`, `{"model":`, `["a"]`, `"s"`, `null`, `{"max_tokens":1e3}`, `{"max_tokens":1.5}`,
		`{"max_tokens":"5"}`, `{"model":5}`, `{"stream":"yes"}`, `{"a":1}{}`, `{"a" 1}`, `{"a":1,}`, `{"a":[1,]}`, `{"a":tru}`,
		`{"max_tokens":99999999999999999999}`, `{"max_tokens":01}`, `{"max_tokens":-01}`, `{"a":{"b":1}`,
		`{"tools":{}}`, `{"tools":[1]}`, `{"tools":[{"type":5}]}`, `{"tools":[{"type":"web_search_20250305","max_uses":-1}]}`,
		`{"tools":[{"max_uses":"5"}]}`, `{"thinking":{"budget_tokens":1.5}}`, `{"thinking":[]}`, `{"mcp_servers":{}}`, `{"model":"\u00"}`} {
		if h, err := ScanRequestHead([]byte(bad)); !errors.Is(err, ErrMalformedRequest) {
			t.Errorf("ScanRequestHead(%q) = %+v, %v; want ErrMalformedRequest", bad, h, err)
		}
	}
	deep := strings.Repeat(`{"a":`, maxDepth+2) + "1" + strings.Repeat("}", maxDepth+2)
	if _, err := ScanRequestHead([]byte(deep)); err == nil {
		t.Error("nesting deeper than the limit accepted")
	}
}

// TestScanRequestHeadRefusesAmbiguousPricedMembers guards against pricing a
// request by one reading of its priced members while the upstream runs
// another (case M2: "max\u005ftokens" after "max_tokens" made a 1-token
// haiku reservation run as a 64000-token opus call).
func TestScanRequestHeadRefusesAmbiguousPricedMembers(t *testing.T) {
	for _, bad := range []string{
		`{"model":"claude-3-haiku-20240307","max_tokens":1,"stream":true,"max\u005ftokens":64000,"mod\u0065l":"claude-opus-4-1-20250805","messages":[]}`,
		`{"max\u005ftokens":64000}`,                // escaped, alone
		`{"model":"a","model":"b"}`,                // twice
		`{"max_tokens":1,"max_tokens":2}`,          // twice
		`{"max_tokens":1,"Max_Tokens":64000}`,      // another case: encoding/json reads it
		`{"max_tokens":1,"max_to\u212aens":64000}`, // Kelvin sign folds to k
		`{"max_tokens":1,"max_toKens":64000}`,
		`{"model":"a","MODEL":"b"}`,
		`{"ſtream":true}`, // long s folds to s
		`{"stream":false,"str\u0065am":true}`,
		`{"thinking":{"type":"enabled","budget_tokens":1},"thinking":{"type":"enabled","budget_tokens":9000}}`,
		`{"thinking":{"budget_tokens":1,"budget\u005ftokens":9000}}`,
		`{"tools":[],"tool\u0073":[{"type":"web_search_20250305"}]}`,
		`{"tools":[{"type":"custom","typ\u0065":"web_search_20250305"}]}`,
		`{"tools":[{"type":"custom","Type":"web_search_20250305"}]}`,
		`{"tools":[{"type":"web_search_20250305","max_uses":1,"max_uses":50}]}`,
		`{"tools":[{"type":"web_fetch_20250910","max_content_tokens":1,"MAX_CONTENT_TOKENS":900000}]}`,
		`{"mcp_servers":[],"mcp_servers":[{}]}`,
		`{"model":"claude-3-haiku\ud800"}`, // a lone surrogate: U+FFFD in Go, kept by others
		"{\"model\":\"claude-3-haiku\xff\"}",
	} {
		_, err := ScanRequestHead([]byte(bad))
		if !errors.Is(err, ErrAmbiguousRequest) || !errors.Is(err, ErrMalformedRequest) {
			t.Errorf("ScanRequestHead(%s): got %v, want ErrAmbiguousRequest", bad, err)
		}
	}
}

func TestRequestHeadWithMaxTokens(t *testing.T) {
	body := []byte(`{"model":"m", "max_tokens" : 64000 ,"messages":[{"role":"user","content":"max_tokens: 7"}]}`)
	h, err := ScanRequestHead(body)
	if err != nil {
		t.Fatal(err)
	}
	out, ok := h.WithMaxTokens(body, 1234)
	if want := `{"model":"m", "max_tokens" : 1234 ,"messages":[{"role":"user","content":"max_tokens: 7"}]}`; !ok || string(out) != want {
		t.Errorf("WithMaxTokens: got %s, %v; want %s", out, ok, want)
	}
	if string(body) != `{"model":"m", "max_tokens" : 64000 ,"messages":[{"role":"user","content":"max_tokens: 7"}]}` {
		t.Errorf("WithMaxTokens changed its input: %s", body)
	}
	for _, none := range []string{`{"model":"m"}`, `{"max_tokens":null}`} {
		h, _ := ScanRequestHead([]byte(none))
		if _, ok := h.WithMaxTokens([]byte(none), 5); ok {
			t.Errorf("WithMaxTokens(%s): got ok, want false (no max_tokens to lower)", none)
		}
	}
}

// jsonHead is a request as encoding/json reads it into a struct: member
// names matched case-insensitively, the last of duplicates winning.
type jsonHead struct {
	Model     *string `json:"model"`
	MaxTokens *int64  `json:"max_tokens"`
	Stream    *bool   `json:"stream"`
	Thinking  *struct {
		BudgetTokens int64 `json:"budget_tokens"`
	} `json:"thinking"`
	Tools []struct {
		Type             string `json:"type"`
		MaxUses          int64  `json:"max_uses"`
		MaxContentTokens int64  `json:"max_content_tokens"`
	} `json:"tools"`
	MCPServers []json.RawMessage `json:"mcp_servers"`
}

func (j jsonHead) head() RequestHead {
	var h RequestHead
	if j.Model != nil {
		h.Model = *j.Model
	}
	if j.MaxTokens != nil {
		h.MaxTokens = *j.MaxTokens
	}
	if j.Stream != nil {
		h.Stream = *j.Stream
	}
	if j.Thinking != nil {
		h.ThinkingBudget = j.Thinking.BudgetTokens
	}
	for _, t := range j.Tools {
		if !IsClientTool(t.Type) {
			h.ServerTools = append(h.ServerTools, ServerTool{Type: t.Type, MaxUses: t.MaxUses, MaxContentTokens: t.MaxContentTokens})
		}
	}
	h.MCPServers = len(j.MCPServers)
	return h
}

// FuzzScanRequestHead compares the gateway's reading of a request with
// encoding/json's on the same bytes, both ways:
//   - whenever the scanner accepts a body that is valid JSON, encoding/json
//     reads the same priced members, both into a struct (names matched
//     case-insensitively) and into a map (names exact after unescaping,
//     the last duplicate winning), so no common reading differs from the
//     one priced;
//   - whenever encoding/json decodes a plain request (an object whose
//     member names are written without escapes, none twice, none in
//     another case), the scanner accepts it.
func FuzzScanRequestHead(f *testing.F) {
	for _, s := range []string{
		`{"model":"claude-x","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","model":"b"}`, `{"max_tokens":null}`, `{"x":{"max_tokens":1}}`, `{"model":"\ud83d\ude00"}`, `{}`, `[]`,
		`{"a":"\\","model":"m"}`, `{"a":"\\\"","max_tokens":3}`,
		`{"model":"claude-3-haiku-20240307","max_tokens":1,"stream":true,"max\u005ftokens":64000,"mod\u0065l":"claude-opus-4-1-20250805","messages":[]}`,
		`{"Max_tokens":5}`, `{"max_to\u212aens":5}`, `{"tools":[{"type":"web_search_20250305","max_uses":3}],"thinking":{"type":"enabled","budget_tokens":10}}`,
		`{"tools":[{"type":"custom","TYPE":"web_fetch_20250910"}],"mcp_servers":[{}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ScanRequestHead(b)
		var st jsonHead
		stErr := json.Unmarshal(b, &st)
		isObject := bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{"))
		if err == nil {
			if stErr != nil || !isObject {
				return // invalid JSON the scanner did not look into: the upstream refuses it
			}
			if d := cmp.Diff(st.head(), got, ignoreAt, cmpopts.EquateEmpty()); d != "" {
				t.Fatalf("%q: the scanner priced a reading encoding/json (struct) does not share (-json +scanner):\n%s", b, d)
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(b, &m) == nil {
				var exact jsonHead
				for k, v := range m {
					one, _ := json.Marshal(map[string]json.RawMessage{k: v})
					if err := json.Unmarshal(one, &exact); err != nil {
						t.Fatalf("%q: member %q: %v", b, k, err)
					}
				}
				if d := cmp.Diff(exact.head(), got, ignoreAt, cmpopts.EquateEmpty()); d != "" {
					t.Fatalf("%q: the scanner priced a reading encoding/json (map) does not share (-json +scanner):\n%s", b, d)
				}
			}
			return
		}
		if stErr != nil || !isObject || !plainNames(b) || strings.ContainsRune(derefModel(st.Model), utf8.RuneError) {
			return // ambiguous on purpose, or a model refused on purpose
		}
		t.Fatalf("encoding/json decodes %q but the scanner fails: %v", b, err)
	})
}

func derefModel(m *string) string {
	if m == nil {
		return ""
	}
	return *m
}

// plainNames reports whether b (valid JSON) is written without a backslash
// (so no member name has an escape) and no object in it has a member name
// twice or one that matches a priced name only case-insensitively.
func plainNames(b []byte) bool {
	if bytes.IndexByte(b, '\\') >= 0 {
		return false
	}
	priced := append(append(append([]string{}, pricedMembers...), toolMembers...), thinkingMembers...)
	dec := json.NewDecoder(bytes.NewReader(b))
	ok := true
	var walk func() bool
	walk = func() bool {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		d, isDelim := tok.(json.Delim)
		if !isDelim {
			return true
		}
		seen := map[string]bool{}
		for dec.More() {
			if d == '{' {
				k, err := dec.Token()
				if err != nil {
					return false
				}
				name := k.(string)
				if seen[name] {
					ok = false
				}
				seen[name] = true
				for _, n := range priced {
					if strings.EqualFold(name, n) && name != n {
						ok = false
					}
				}
			}
			if !walk() {
				return false
			}
		}
		_, err = dec.Token()
		return err == nil
	}
	return walk() && ok
}
