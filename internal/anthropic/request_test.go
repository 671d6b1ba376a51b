package anthropic

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestScanRequestHead(t *testing.T) {
	cases := []struct {
		in   string
		want RequestHead
	}{
		{`{"model":"claude-x","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, RequestHead{"claude-x", 1024, true}},
		{` { "messages" : [ {"content":[{"type":"text","text":"\"max_tokens\":9 }"}]} ], "max_tokens" : 7 , "model":"m\u00e9" } `, RequestHead{"mé", 7, false}},
		{`{"tools":{"nested":{"max_tokens":99,"model":"no"}},"max_tokens":3}`, RequestHead{"", 3, false}},
		{`{"model":null,"max_tokens":null,"stream":null}`, RequestHead{}},
		{`{}`, RequestHead{}},
		// Escapes before a quote: an even run of backslashes ends the string, an odd one does not.
		{`{"messages":"a\\","model":"m","system":"x\\\"\"y\\\\","max_tokens":2}`, RequestHead{"m", 2, false}},
		{`{"messages":"\",\"model\":\"fake\"","model":"real"}`, RequestHead{"real", 0, false}},
		{`{"metadata":{"a":[1,2.5e3,-1,true,false,null,"x"]},"stream":false,"max_tokens":-5}`, RequestHead{"", -5, false}},
	}
	for _, tc := range cases {
		got, err := ScanRequestHead([]byte(tc.in))
		if err != nil || got != tc.want {
			t.Errorf("ScanRequestHead(%s) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{``, `not json`, `{"model":`, `["a"]`, `"s"`, `null`, `{"max_tokens":1e3}`, `{"max_tokens":1.5}`,
		`{"max_tokens":"5"}`, `{"model":5}`, `{"stream":"yes"}`, `{"a":1}{}`, `{"a" 1}`, `{"a":1,}`, `{"a":[1,]}`, `{"a":tru}`,
		`{"max_tokens":99999999999999999999}`, `{"max_tokens":01}`, `{"max_tokens":1,"max_tokens":2}`, `{"model":"a","model":"b"}`, `{"model":"a` + "\n" + `"}`, `{"a":{"b":1}`} {
		if h, err := ScanRequestHead([]byte(bad)); !errors.Is(err, ErrMalformedRequest) {
			t.Errorf("ScanRequestHead(%q) = %+v, %v; want ErrMalformedRequest", bad, h, err)
		}
	}
	deep := strings.Repeat(`{"a":`, maxDepth+2) + "1" + strings.Repeat("}", maxDepth+2)
	if _, err := ScanRequestHead([]byte(deep)); err == nil {
		t.Error("nesting deeper than the limit accepted")
	}
}

// FuzzScanRequestHead checks the scanner against encoding/json: whenever
// encoding/json decodes a body (without the priced members twice), the
// scanner accepts it and reads the same model, max_tokens and stream.
func FuzzScanRequestHead(f *testing.F) {
	for _, s := range []string{
		`{"model":"claude-x","max_tokens":1024,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"a","model":"b"}`, `{"max_tokens":null}`, `{"x":{"max_tokens":1}}`, `{"model":"\ud83d\ude00"}`, `{}`, `[]`,
		`{"a":"\\","model":"m"}`, `{"a":"\\\"","max_tokens":3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ScanRequestHead(b)
		var ref struct {
			Model     *string `json:"model"`
			MaxTokens *int64  `json:"max_tokens"`
			Stream    *bool   `json:"stream"`
		}
		refErr := json.Unmarshal(b, &ref)
		// encoding/json also decodes a bare null into a struct; a request
		// is an object.
		isObject := strings.HasPrefix(strings.TrimLeft(string(b), " \t\r\n"), "{")
		if refErr != nil || !isObject || !strictKeys(b) || errors.Is(err, ErrMalformedRequest) && strings.Contains(err.Error(), "given twice") {
			return
		}
		if err != nil {
			t.Fatalf("encoding/json decodes %q but the scanner fails: %v", b, err)
		}
		want := RequestHead{}
		if ref.Model != nil {
			want.Model = *ref.Model
		}
		if ref.MaxTokens != nil {
			want.MaxTokens = *ref.MaxTokens
		}
		if ref.Stream != nil {
			want.Stream = *ref.Stream
		}
		if got != want {
			t.Fatalf("%q: scanner %+v, encoding/json %+v", b, got, want)
		}
	})
}

// strictKeys reports whether every top-level key of b is spelled exactly
// (encoding/json matches "Model" or "MODEL" to the model field too; the
// Anthropic API does not, and neither does the scanner).
func strictKeys(b []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return false
	}
	for k := range m {
		l := strings.ToLower(k)
		if (l == "model" || l == "max_tokens" || l == "stream") && k != l {
			return false
		}
	}
	return true
}
