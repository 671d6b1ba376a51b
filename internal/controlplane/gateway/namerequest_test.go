package gateway

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestNameRequest: an upstream error envelope's message, and only it,
// gets the request id; anything else passes byte for byte.
func TestNameRequest(t *testing.T) {
	const id = "req_abc"
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"type":"error","error":{"type":"api_error","message":"x"}}`))
	zw.Close()
	for _, tc := range []struct {
		name, body, want string
		status           int
		header           http.Header
	}{
		{"envelope", `{"type":"error","error":{"type":"api_error","message":"boom"},"request_id":"req_up"}`,
			`{"type":"error","error":{"type":"api_error","message":"boom (request req_abc)"},"request_id":"req_up"}`, 500, nil},
		{"spacing, escapes and a message in details kept", "{ \"error\" : {\"details\":{\"message\":\"inner\"}, \"message\" : \"a \\\"quoted\\\" \\u00e9\" }, \"type\":\"error\"}",
			"{ \"error\" : {\"details\":{\"message\":\"inner\"}, \"message\" : \"a \\\"quoted\\\" é (request req_abc)\" }, \"type\":\"error\"}", 400, nil},
		{"already named", `{"type":"error","error":{"type":"x","message":"m (request req_abc)"}}`, "", 400, nil},
		{"not an error envelope", `{"type":"message","error":{"message":"m"}}`, "", 400, nil},
		{"message not a string", `{"type":"error","error":{"message":5}}`, "", 400, nil},
		{"message null", `{"type":"error","error":{"type":"api_error","message":null}}`, "", 400, nil},
		{"message twice", `{"type":"error","error":{"message":"first","message":"second"}}`, "", 400, nil},
		{"error twice", `{"type":"error","error":{"message":"a"},"error":{"message":"b"}}`, "", 400, nil},
		{"an id that is part of the message only", `{"type":"error","error":{"message":"req_abc failed"}}`,
			`{"type":"error","error":{"message":"req_abc failed (request req_abc)"}}`, 400, nil},
		{"not JSON", `<html>bad gateway</html>`, "", 502, nil},
		{"a success", `{"type":"error","error":{"message":"m"}}`, "", 200, nil},
		{"compressed", gz.String(), "", 500, http.Header{"Content-Encoding": {"gzip"}}},
		{"over 64 KiB", `{"type":"error","error":{"message":"` + strings.Repeat("a", maxNamedErrorBody) + `"}}`, "", 500, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{"Content-Type": {"application/json"}}
			for k, v := range tc.header {
				h[k] = v
			}
			resp := &http.Response{StatusCode: tc.status, Header: h, Body: io.NopCloser(strings.NewReader(tc.body)), ContentLength: int64(len(tc.body))}
			nameRequest(resp, id)
			got, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			if want == "" {
				want = tc.body
			}
			if string(got) != want {
				t.Errorf("got  %q\nwant %q", got, want)
			}
			if tc.want != "" {
				if !json.Valid(got) || resp.ContentLength != int64(len(got)) || resp.Header.Get("Content-Length") != strconv.Itoa(len(got)) {
					t.Errorf("valid %v, length %d / %q for %d bytes", json.Valid(got), resp.ContentLength, resp.Header.Get("Content-Length"), len(got))
				}
			}
		})
	}
}

// FuzzNameRequest: whatever the upstream sends, valid JSON stays valid
// JSON and a body that was not named passes byte for byte.
func FuzzNameRequest(f *testing.F) {
	f.Add([]byte(`{"type":"error","error":{"type":"api_error","message":"boom"}}`))
	f.Add([]byte(`{"type":"error","error":{"message":null}}`))
	f.Add([]byte(`{"error":{"details":{"message":"x"},"message":"\u00e9\"q"},"type":"error"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		resp := &http.Response{StatusCode: 500, Header: http.Header{"Content-Type": {"application/json"}},
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body))}
		nameRequest(resp, "req_fuzz")
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if json.Valid(body) && !json.Valid(got) {
			t.Fatalf("valid %q became invalid %q", body, got)
		}
		if !bytes.Equal(got, body) && (!bytes.Contains(got, []byte(" (request req_fuzz)")) || len(got) != int(resp.ContentLength)) {
			t.Fatalf("%q changed into %q (length %d)", body, got, resp.ContentLength)
		}
	})
}
