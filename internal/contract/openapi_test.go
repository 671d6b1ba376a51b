package contract_test

// These tests keep docs/openapi.yaml (worker API), docs/browser-openapi.yaml
// (browser API) and docs/worker-api.md in step with the Go code:
//
//   - both documents load and pass kin-openapi's validation;
//   - every schema that mirrors a Go struct has exactly the struct's JSON
//     property names, the right required list and compatible types, so adding
//     a field to a contract struct without documenting it fails here;
//   - every EventType, SessionState, ErrType* and Fail* constant of package
//     contract is in the documented enums and vice versa; the constants are
//     listed explicitly below and the list is checked against the source of
//     package contract, so a new constant fails here until it is documented;
//   - every worker path constant is documented with the method, request and
//     answer its comment in contract.go names, and the worker and control
//     plane register exactly the documented routes;
//   - the error tables of docs/worker-api.md and docs/browser-api.md list
//     every ErrType* with its status (TestErrorTablesDocumented);
//   - the request-token scheme as docs/worker-api.md describes it (HKDF label,
//     claims, HS256 with kid, body hash) produces tokens the real verifier
//     accepts.

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/golang-jwt/jwt/v5"

	"github.com/talkide/talkide/internal/apidoc"
	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/token"
)

const (
	workerDocPath  = "../../docs/openapi.yaml"
	browserDocPath = "../../docs/browser-openapi.yaml"
	workerMDPath   = "../../docs/worker-api.md"
	contractDir    = "."
	workerPkgDir   = "../worker"
	controlPkgDir  = "../controlplane"
	schemaRefBase  = "#/components/schemas/"
)

// eventTypes lists every EventType constant with its payload type. Go cannot
// enumerate constants; TestEventTypesDocumented compares this list with the
// source of package contract.
var eventTypes = []struct {
	name    string
	value   contract.EventType
	payload any
}{
	{"EventSessionStarted", contract.EventSessionStarted, contract.SessionStarted{}},
	{"EventUserMessage", contract.EventUserMessage, contract.UserMessage{}},
	{"EventTurnStarted", contract.EventTurnStarted, contract.TurnStarted{}},
	{"EventAssistantText", contract.EventAssistantText, contract.AssistantText{}},
	{"EventToolUse", contract.EventToolUse, contract.ToolUse{}},
	{"EventToolResult", contract.EventToolResult, contract.ToolResult{}},
	{"EventAPIRetry", contract.EventAPIRetry, contract.APIRetry{}},
	{"EventTurnCompleted", contract.EventTurnCompleted, contract.TurnCompleted{}},
	{"EventTurnFailed", contract.EventTurnFailed, contract.TurnFailed{}},
	{"EventError", contract.EventError, contract.ErrorEvent{}},
	{"EventSessionStopped", contract.EventSessionStopped, contract.SessionStopped{}},
	{"EventMCPServerRefused", contract.EventMCPServerRefused, contract.MCPServerRefused{}},
	{"EventLimitReached", contract.EventLimitReached, contract.LimitReached{}},
	{"EventTurnQueued", contract.EventTurnQueued, contract.TurnQueued{}},
	{"EventPermissionRequested", contract.EventPermissionRequested, contract.PermissionRequested{}},
	{"EventPermissionResolved", contract.EventPermissionResolved, contract.PermissionResolved{}},
	{"EventBuildStarted", contract.EventBuildStarted, contract.BuildStarted{}},
	{"EventBuildProgress", contract.EventBuildProgress, contract.BuildProgress{}},
	{"EventBuildCompleted", contract.EventBuildCompleted, contract.BuildCompleted{}},
}

// sessionStates, errorTypes and failReasons list the other documented
// constant sets, by constant name.
var (
	sessionStates = map[string]string{
		"StateIdle":    string(contract.StateIdle),
		"StateRunning": string(contract.StateRunning),
		"StateStopped": string(contract.StateStopped),
	}
	errorTypes = map[string]string{
		"ErrTypeInvalidRequest": contract.ErrTypeInvalidRequest,
		"ErrTypeUnauthorized":   contract.ErrTypeUnauthorized,
		"ErrTypeForbidden":      contract.ErrTypeForbidden,
		"ErrTypeNotFound":       contract.ErrTypeNotFound,
		"ErrTypeMethod":         contract.ErrTypeMethod,
		"ErrTypeConflict":       contract.ErrTypeConflict,
		"ErrTypeTooLarge":       contract.ErrTypeTooLarge,
		"ErrTypeUnsupported":    contract.ErrTypeUnsupported,
		"ErrTypeRateLimited":    contract.ErrTypeRateLimited,
		"ErrTypeInternal":       contract.ErrTypeInternal,
		"ErrTypeUnavailable":    contract.ErrTypeUnavailable,
		"ErrTypeUpstream":       contract.ErrTypeUpstream,
		"ErrTypeTimeout":        contract.ErrTypeTimeout,
	}
	failReasons = map[string]string{
		"FailAPIError":        contract.FailAPIError,
		"FailInterrupted":     contract.FailInterrupted,
		"FailMaxTurns":        contract.FailMaxTurns,
		"FailProcessExited":   contract.FailProcessExited,
		"FailStartFailed":     contract.FailStartFailed,
		"FailWorkerRestarted": contract.FailWorkerRestarted,
		"FailExecution":       contract.FailExecution,
	}
)

// mirrored is a schema that mirrors a Go struct.
type mirrored struct {
	schema string
	goType any
	mode   mirrorMode
}

// mirrorMode says how a schema's required list relates to its Go struct.
type mirrorMode int

const (
	// answer: a value the platform encodes; required must equal the fields
	// without omitempty (encoding/json always writes those).
	answer mirrorMode = iota
	// request: a body the server decodes with unknown fields refused;
	// required may be a subset of the fields and additionalProperties must
	// be false.
	request
	// claims: token claims; every field is omitempty in Go, and required
	// lists what the verifier demands, a subset of the fields.
	claims
)

// workerSchemas are the schemas of docs/openapi.yaml that mirror Go structs;
// the event payloads are added from eventTypes.
var workerSchemas = []mirrored{
	{"CreateSessionRequest", contract.CreateSessionRequest{}, request},
	{"SessionStatus", contract.SessionStatus{}, answer},
	{"SendMessageRequest", contract.SendMessageRequest{}, request},
	{"SendMessageResponse", contract.SendMessageResponse{}, answer},
	{"InterruptResponse", contract.InterruptResponse{}, answer},
	{"SessionDeleted", contract.SessionDeleted{}, answer},
	{"Event", contract.Event{}, answer},
	{"ErrorBody", contract.ErrorBody{}, answer},
	{"ErrorDetail", contract.ErrorDetail{}, answer},
	{"Usage", contract.Usage{}, answer},
	{"BuildTestFailure", contract.BuildTestFailure{}, answer},
	{"MintRequest", contract.MintRequest{}, request},
	{"MintResponse", contract.MintResponse{}, answer},
	// The claims of every platform token; jwt.RegisteredClaims is embedded.
	{"TokenClaims", token.Claims{}, claims},
	// Reporting (worker → control plane).
	{"ToolEventReport", contract.ToolEventReport{}, request},
	{"UsageReport", contract.UsageReport{}, request},
	{"ActivityReport", contract.ActivityReport{}, request},
	{"ReportAck", contract.ReportAck{}, answer},
	{"ReportBatch", contract.ReportBatch{}, request},
	{"ReportGroup", contract.ReportGroup{}, request},
	{"BatchedReport", contract.BatchedReport{}, request},
	{"ReportBatchAck", contract.ReportBatchAck{}, answer},
	{"ReportGroupAck", contract.ReportGroupAck{}, answer},
	{"ReportResult", contract.ReportResult{}, answer},
	{"IssueCreate", contract.IssueCreate{}, request},
	{"IssueUpdate", contract.IssueUpdate{}, request},
	{"IssueComment", contract.IssueComment{}, request},
	{"IssueAck", contract.IssueAck{}, answer},
	{"Issue", contract.Issue{}, answer},
	{"IssueCommentEntry", contract.IssueCommentEntry{}, answer},
	{"IssueList", contract.IssueList{}, answer},
}

// browserSchemas are the contract types docs/browser-openapi.yaml repeats.
var browserSchemas = []mirrored{
	{"SessionStatus", contract.SessionStatus{}, answer},
	{"SendMessageResponse", contract.SendMessageResponse{}, answer},
	{"InterruptResponse", contract.InterruptResponse{}, answer},
	{"Event", contract.Event{}, answer},
	{"ErrorBody", contract.ErrorBody{}, answer},
	{"ErrorDetail", contract.ErrorDetail{}, answer},
	{"Usage", contract.Usage{}, answer},
	{"BuildTestFailure", contract.BuildTestFailure{}, answer},
	{"Issue", contract.Issue{}, answer},
	{"IssueCommentEntry", contract.IssueCommentEntry{}, answer},
	{"IssueList", contract.IssueList{}, answer},
	{"ConversationActivity", contract.ConversationActivity{}, answer},
	{"ActivityEntry", contract.ActivityEntry{}, answer},
	{"ToolCall", contract.ToolCall{}, answer},
	{"TurnUsage", contract.TurnUsage{}, answer},
}

// browserStructs are the control plane's unexported browser API types
// (internal/controlplane), checked through their source, with the schema of
// docs/browser-openapi.yaml that documents each.
var browserStructs = map[string]string{
	"createConversationRequest": "CreateConversationRequest",
	"conversationResponse":      "Conversation",
	"conversationJSON":          "ConversationSummary",
	"conversationList":          "ConversationList",
	"renameRequest":             "RenameConversationRequest",
	"meResponse":                "Me",
	"grantJSON":                 "Grant",
	"spendJSON":                 "Spend",
	"sendMessageRequest":        "PostMessageRequest",
}

func loadDoc(t *testing.T, path string) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile(path)
	if err != nil {
		t.Fatalf("load %s: %v", path, err)
	}
	return doc
}

func TestOpenAPIDocumentsValidate(t *testing.T) {
	for _, p := range []string{workerDocPath, browserDocPath} {
		doc := loadDoc(t, p)
		if err := doc.Validate(context.Background()); err != nil {
			t.Errorf("%s does not validate: %v", p, err)
		}
		if !strings.HasPrefix(doc.OpenAPI, "3.0.") {
			t.Errorf("%s: openapi %q, want 3.0.x", p, doc.OpenAPI)
		}
	}
}

func TestSchemasMatchGoTypes(t *testing.T) {
	worker := loadDoc(t, workerDocPath)
	browser := loadDoc(t, browserDocPath)
	all := slices.Clone(workerSchemas)
	browserAll := slices.Clone(browserSchemas)
	for _, e := range eventTypes {
		m := mirrored{schema: reflect.TypeOf(e.payload).Name(), goType: e.payload, mode: answer}
		all = append(all, m)
		browserAll = append(browserAll, m)
	}
	for _, m := range all {
		checkMirror(t, "openapi.yaml", worker, m)
	}
	for _, m := range browserAll {
		checkMirror(t, "browser-openapi.yaml", browser, m)
	}
}

// checkMirror compares schema m.schema of doc with the Go struct m.goType.
func checkMirror(t *testing.T, docName string, doc *openapi3.T, m mirrored) {
	t.Helper()
	s := schemaNamed(doc, m.schema)
	if s == nil {
		t.Errorf("%s: schema %s (Go %T) missing", docName, m.schema, m.goType)
		return
	}
	fields := jsonFields(reflect.TypeOf(m.goType))
	want := slices.Sorted(maps.Keys(fields))
	got := slices.Sorted(maps.Keys(s.Properties))
	if !slices.Equal(got, want) {
		t.Errorf("%s: schema %s has properties %v, Go %T has JSON fields %v", docName, m.schema, got, m.goType, want)
	}
	var always []string
	for name, f := range fields {
		if !f.omitempty {
			always = append(always, name)
		}
	}
	slices.Sort(always)
	required := slices.Sorted(slices.Values(s.Required))
	switch m.mode {
	case answer:
		if !slices.Equal(required, always) {
			t.Errorf("%s: schema %s requires %v, but Go %T always encodes %v", docName, m.schema, required, m.goType, always)
		}
	case request, claims:
		for _, r := range required {
			if _, ok := fields[r]; !ok {
				t.Errorf("%s: schema %s requires %q, which Go %T does not have", docName, m.schema, r, m.goType)
			}
		}
	}
	if m.mode == request && (s.AdditionalProperties.Has == nil || *s.AdditionalProperties.Has) {
		t.Errorf("%s: schema %s is a request body the server decodes strictly: want additionalProperties: false", docName, m.schema)
	}
	for name, f := range fields {
		if p := s.Properties[name]; p != nil {
			checkType(t, docName, doc, m.schema+"."+name, p, f.typ)
		}
	}
}

type jsonField struct {
	typ       reflect.Type
	omitempty bool
}

// jsonFields returns the JSON object members encoding/json writes for struct
// type st: tag names (or field names), with embedded structs promoted unless
// they have a tag name, and "-" and unexported fields left out.
func jsonFields(st reflect.Type) map[string]jsonField {
	out := map[string]jsonField{}
	for f := range st.Fields() {
		tag, hasTag := f.Tag.Lookup("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if f.Anonymous {
			et := ft
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if name == "" && et.Kind() == reflect.Struct {
				for n, jf := range jsonFields(et) {
					if _, dup := out[n]; !dup {
						out[n] = jf
					}
				}
				continue
			}
			if !f.IsExported() && et.Kind() != reflect.Struct {
				continue
			}
		} else if !f.IsExported() {
			continue
		}
		if name == "" || !hasTag {
			name = f.Name
		}
		out[name] = jsonField{typ: ft, omitempty: slices.Contains(strings.Split(opts, ","), "omitempty")}
	}
	return out
}

func schemaNamed(doc *openapi3.T, name string) *openapi3.Schema {
	if doc.Components == nil {
		return nil
	}
	ref := doc.Components.Schemas[name]
	if ref == nil {
		return nil
	}
	return ref.Value
}

// resolved follows a single-element allOf wrapper (used to describe a $ref).
func resolved(r *openapi3.SchemaRef) (ref string, s *openapi3.Schema) {
	for r != nil {
		if r.Ref != "" {
			return r.Ref, r.Value
		}
		if r.Value != nil && len(r.Value.AllOf) == 1 && len(r.Value.Properties) == 0 && r.Value.Type == nil {
			r = r.Value.AllOf[0]
			continue
		}
		return "", r.Value
	}
	return "", nil
}

var (
	timeType        = reflect.TypeFor[time.Time]()
	rawMessageType  = reflect.TypeFor[json.RawMessage]()
	numericDateType = reflect.TypeFor[jwt.NumericDate]() // Unix seconds
)

// checkType checks that property schema p can hold values of Go type gt.
func checkType(t *testing.T, docName string, doc *openapi3.T, where string, p *openapi3.SchemaRef, gt reflect.Type) {
	t.Helper()
	ref, s := resolved(p)
	if s == nil {
		t.Errorf("%s: %s: unresolved schema", docName, where)
		return
	}
	if gt.Kind() == reflect.Pointer {
		gt = gt.Elem()
	}
	is := func(typ string) bool { return s.Type.Is(typ) }
	switch {
	case gt == timeType:
		if !is("string") || s.Format != "date-time" {
			t.Errorf("%s: %s: Go time.Time needs type string, format date-time", docName, where)
		}
	case gt == rawMessageType:
		// Any JSON value; the documents say which.
	case gt == numericDateType:
		if !is("integer") {
			t.Errorf("%s: %s: jwt.NumericDate needs type integer (Unix seconds)", docName, where)
		}
	case gt.Kind() == reflect.Struct:
		if want := schemaRefBase + gt.Name(); ref != want {
			t.Errorf("%s: %s: Go %s needs $ref %q, got %q", docName, where, gt, want, ref)
		}
	case gt.Kind() == reflect.String:
		if !is("string") {
			t.Errorf("%s: %s: Go %s needs type string", docName, where, gt)
		}
		// A named string type of the contract is documented by a schema of
		// the same name (SessionState, EventType).
		if gt.PkgPath() == reflect.TypeFor[contract.Event]().PkgPath() {
			if want := schemaRefBase + gt.Name(); ref != want {
				t.Errorf("%s: %s: Go %s needs $ref %q, got %q", docName, where, gt, want, ref)
			}
		}
	case gt.Kind() == reflect.Bool:
		if !is("boolean") {
			t.Errorf("%s: %s: Go %s needs type boolean", docName, where, gt)
		}
	case gt.Kind() >= reflect.Int && gt.Kind() <= reflect.Uint64:
		if !is("integer") {
			t.Errorf("%s: %s: Go %s needs type integer", docName, where, gt)
		}
		if gt.Kind() == reflect.Int64 && s.Format != "int64" {
			t.Errorf("%s: %s: Go int64 needs format int64", docName, where)
		}
	case gt.Kind() == reflect.Slice:
		if !is("array") || s.Items == nil {
			t.Errorf("%s: %s: Go %s needs an array", docName, where, gt)
			return
		}
		checkType(t, docName, doc, where+"[]", s.Items, gt.Elem())
	default:
		t.Errorf("%s: %s: Go kind %s not handled by this test; extend checkType", docName, where, gt.Kind())
	}
}

// contractConsts parses package contract's source and returns its constants
// with a string value, by name, each with its declared type name ("" when
// untyped).
func contractConsts(t *testing.T) map[string]constInfo {
	t.Helper()
	out := map[string]constInfo{}
	for _, f := range parsePackage(t, contractDir) {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != gotoken.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				typ := ""
				if id, ok := vs.Type.(*ast.Ident); ok {
					typ = id.Name
				}
				for i, n := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != gotoken.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatalf("constant %s: %v", n.Name, err)
					}
					comment := ""
					if vs.Comment != nil {
						comment = strings.TrimSpace(vs.Comment.Text())
					}
					out[n.Name] = constInfo{typ: typ, value: v, comment: comment}
				}
			}
		}
	}
	return out
}

type constInfo struct {
	typ, value, comment string
}

// parsePackage parses the non-test Go files of dir.
func parsePackage(t *testing.T, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("parse %s: %v", n, err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		t.Fatalf("no Go files in %s", dir)
	}
	return files
}

// sourceSet returns the constants of package contract selected by keep,
// name → value.
func sourceSet(consts map[string]constInfo, keep func(name string, c constInfo) bool) map[string]string {
	out := map[string]string{}
	for n, c := range consts {
		if keep(n, c) {
			out[n] = c.value
		}
	}
	return out
}

func enumOf(t *testing.T, docName string, doc *openapi3.T, schema string) []string {
	t.Helper()
	s := schemaNamed(doc, schema)
	if s == nil {
		t.Errorf("%s: schema %s missing", docName, schema)
		return nil
	}
	var out []string
	for _, v := range s.Enum {
		str, ok := v.(string)
		if !ok {
			t.Errorf("%s: %s enum holds non-string %v", docName, schema, v)
		}
		out = append(out, str)
	}
	slices.Sort(out)
	return out
}

func TestEventTypesDocumented(t *testing.T) {
	listed := map[string]string{}
	for _, e := range eventTypes {
		listed[e.name] = string(e.value)
	}
	inSource := sourceSet(contractConsts(t), func(_ string, c constInfo) bool { return c.typ == "EventType" })
	if !maps.Equal(listed, inSource) {
		t.Fatalf("EventType constants in package contract %v differ from this test's list %v: add the new type to eventTypes (with its payload) and document it in docs/openapi.yaml, docs/browser-openapi.yaml and docs/worker-api.md", inSource, listed)
	}
	want := slices.Sorted(maps.Values(listed))

	md, err := os.ReadFile(workerMDPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eventTypes {
		if !strings.Contains(string(md), "| `"+string(e.value)+"` | `"+reflect.TypeOf(e.payload).Name()+"` |") {
			t.Errorf("worker-api.md: the event-type table has no row for %s with payload %s", e.value, reflect.TypeOf(e.payload).Name())
		}
	}

	for docName, p := range map[string]string{"openapi.yaml": workerDocPath, "browser-openapi.yaml": browserDocPath} {
		doc := loadDoc(t, p)
		if got := enumOf(t, docName, doc, "EventType"); !slices.Equal(got, want) {
			t.Errorf("%s: EventType enum %v, want %v", docName, got, want)
		}
		any := schemaNamed(doc, "AnyEvent")
		if any == nil || any.Discriminator == nil || any.Discriminator.PropertyName != "type" {
			t.Errorf("%s: AnyEvent needs a discriminator on type", docName)
			continue
		}
		if got := slices.Sorted(maps.Keys(any.Discriminator.Mapping)); !slices.Equal(got, want) {
			t.Errorf("%s: AnyEvent discriminator maps %v, want %v", docName, got, want)
		}
		var oneOf []string
		for _, r := range any.OneOf {
			oneOf = append(oneOf, r.Ref)
		}
		for _, e := range eventTypes {
			variant := any.Discriminator.Mapping[string(e.value)].Ref
			if !slices.Contains(oneOf, variant) {
				t.Errorf("%s: AnyEvent.oneOf lacks %s (event %s)", docName, variant, e.value)
			}
			checkEventVariant(t, docName, doc, strings.TrimPrefix(variant, schemaRefBase), string(e.value), reflect.TypeOf(e.payload).Name())
		}
		if len(oneOf) != len(eventTypes) {
			t.Errorf("%s: AnyEvent.oneOf has %d entries, want %d", docName, len(oneOf), len(eventTypes))
		}
	}
}

// checkEventVariant checks that schema name is allOf [Event, {type: [value],
// data: $ref payload}].
func checkEventVariant(t *testing.T, docName string, doc *openapi3.T, name, value, payload string) {
	t.Helper()
	s := schemaNamed(doc, name)
	if s == nil {
		t.Errorf("%s: schema %s missing", docName, name)
		return
	}
	if len(s.AllOf) != 2 || s.AllOf[0].Ref != schemaRefBase+"Event" || s.AllOf[1].Value == nil {
		t.Errorf("%s: %s must be allOf [$ref Event, {type, data}]", docName, name)
		return
	}
	props := s.AllOf[1].Value.Properties
	if typ := props["type"]; typ == nil || typ.Value == nil || len(typ.Value.Enum) != 1 || typ.Value.Enum[0] != value {
		t.Errorf("%s: %s.type must be the single value %q", docName, name, value)
	}
	if data := props["data"]; data == nil || data.Ref != schemaRefBase+payload {
		t.Errorf("%s: %s.data must be $ref %s", docName, name, payload)
	}
}

func TestConstantEnumsDocumented(t *testing.T) {
	consts := contractConsts(t)
	cases := []struct {
		what   string
		schema string
		listed map[string]string
		keep   func(string, constInfo) bool
	}{
		{"SessionState", "SessionState", sessionStates, func(_ string, c constInfo) bool { return c.typ == "SessionState" }},
		{"ErrType*", "ErrorType", errorTypes, func(n string, _ constInfo) bool { return strings.HasPrefix(n, "ErrType") }},
		{"Fail*", "TurnFailReason", failReasons, func(n string, _ constInfo) bool { return strings.HasPrefix(n, "Fail") }},
	}
	worker := loadDoc(t, workerDocPath)
	browser := loadDoc(t, browserDocPath)
	for _, tc := range cases {
		if src := sourceSet(consts, tc.keep); !maps.Equal(src, tc.listed) {
			t.Errorf("%s constants in package contract %v differ from this test's list %v: update the list and the documents", tc.what, src, tc.listed)
			continue
		}
		want := slices.Sorted(maps.Values(tc.listed))
		for docName, doc := range map[string]*openapi3.T{"openapi.yaml": worker, "browser-openapi.yaml": browser} {
			if got := enumOf(t, docName, doc, tc.schema); !slices.Equal(got, want) {
				t.Errorf("%s: %s enum %v, want %v (%s constants)", docName, tc.schema, got, want, tc.what)
			}
		}
	}
}

// TestErrorTablesDocumented: the error table of docs/worker-api.md (§6) and
// of docs/browser-api.md (§4) each has one row per ErrType* constant, with
// the status its comment in contract.go gives, and no other type. (Which
// endpoint answers which error is internal/e2e's TestDocumentedErrors.)
func TestErrorTablesDocumented(t *testing.T) {
	consts := contractConsts(t)
	want := map[string]int{} // type → status
	for name, value := range errorTypes {
		st, err := strconv.Atoi(consts[name].comment)
		if err != nil {
			t.Fatalf("contract.%s: its comment %q is not its HTTP status", name, consts[name].comment)
		}
		want[value] = st
	}
	for _, name := range []string{"docs/worker-api.md", "docs/browser-api.md"} {
		d, err := apidoc.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for typ, st := range want {
			row, ok := d.Types[typ]
			switch {
			case !ok:
				t.Errorf("%s: the error table has no row for %s (%d): add one, saying when it is answered or that it is not used", name, typ, st)
			case row.Status != st:
				t.Errorf("%s:%d: error type %s has status %d, want %d (contract.go)", name, row.Line, typ, row.Status, st)
			}
		}
		for typ, row := range d.Types {
			if _, ok := want[typ]; !ok {
				t.Errorf("%s:%d: error type %s is no contract.ErrType* constant", name, row.Line, typ)
			}
		}
	}
}

// buildStates lists the states of contract.BuildProgress, by constant name.
var buildStates = map[string]string{
	"BuildQueued":  contract.BuildQueued,
	"BuildRunning": contract.BuildRunning,
}

// TestBuildConstantsDocumented checks the build states (the string
// constants Build*) against BuildProgress.state, and the bounds of a build's
// log lines against BuildProgress.lines and the prose.
func TestBuildConstantsDocumented(t *testing.T) {
	if src := sourceSet(contractConsts(t), func(n string, _ constInfo) bool { return strings.HasPrefix(n, "Build") }); !maps.Equal(src, buildStates) {
		t.Fatalf("Build* string constants in package contract %v differ from this test's list %v: update the list and BuildProgress.state in the documents", src, buildStates)
	}
	want := slices.Sorted(maps.Values(buildStates))
	perEvent := strconv.Itoa(contract.MaxBuildLinesPerEvent)
	perBuild := strconv.Itoa(contract.MaxBuildLogLines)
	for docName, p := range map[string]string{"openapi.yaml": workerDocPath, "browser-openapi.yaml": browserDocPath} {
		s := schemaNamed(loadDoc(t, p), "BuildProgress")
		if s == nil {
			t.Errorf("%s: schema BuildProgress missing", docName)
			continue
		}
		if st := s.Properties["state"]; st == nil || st.Value == nil {
			t.Errorf("%s: BuildProgress.state missing", docName)
		} else {
			var got []string
			for _, v := range st.Value.Enum {
				str, _ := v.(string)
				got = append(got, str)
			}
			if slices.Sort(got); !slices.Equal(got, want) {
				t.Errorf("%s: BuildProgress.state enum %v, want %v", docName, got, want)
			}
		}
		if l := s.Properties["lines"]; l == nil || l.Value == nil || l.Value.MaxItems == nil || *l.Value.MaxItems != uint64(contract.MaxBuildLinesPerEvent) {
			t.Errorf("%s: BuildProgress.lines needs maxItems %s (MaxBuildLinesPerEvent)", docName, perEvent)
		}
		for _, w := range []string{"at most " + perEvent + " per event (MaxBuildLinesPerEvent)", "at most " + perBuild + " lines in all (MaxBuildLogLines)"} {
			if !strings.Contains(s.Description, w) {
				t.Errorf("%s: BuildProgress description does not say %q", docName, w)
			}
		}
	}
	md, err := os.ReadFile(workerMDPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"at most " + perEvent + " per event (`MaxBuildLinesPerEvent`)", "at most " + perBuild + " for a whole build (`MaxBuildLogLines`)"} {
		if !strings.Contains(strings.Join(strings.Fields(string(md)), " "), w) {
			t.Errorf("worker-api.md does not say %q", w)
		}
	}
}

// workerPaths lists the path constants of package contract and how the
// worker document covers each: kind "endpoint" (a path with one operation),
// "prefix" (documented paths start with it) or "not built".
var workerPaths = []struct {
	name, value, kind string
}{
	{"PathSession", contract.PathSession, "endpoint"},
	{"PathMessages", contract.PathMessages, "endpoint"},
	{"PathInterrupt", contract.PathInterrupt, "endpoint"},
	{"PathStop", contract.PathStop, "endpoint"},
	{"PathStatus", contract.PathStatus, "endpoint"},
	{"PathPermission", contract.PathPermission, "endpoint"},
	{"PathEvents", contract.PathEvents, "endpoint"},
	{"PathWorker", contract.PathWorker, "endpoint"},
	{"PathMint", contract.PathMint, "endpoint"},
	{"PathGatewayPrefix", contract.PathGatewayPrefix, "prefix"},
	{"PathGatewayMessages", contract.PathGatewayMessages, "gateway"},
	{"PathGatewayCountTokens", contract.PathGatewayCountTokens, "gateway"},
	// The reporting endpoints; every documented path under the prefix must
	// be one of the constants below.
	{"PathReportPrefix", contract.PathReportPrefix, "group"},
	{"PathReportToolEvents", contract.PathReportToolEvents, "endpoint"},
	{"PathReportUsage", contract.PathReportUsage, "endpoint"},
	{"PathReportActivity", contract.PathReportActivity, "endpoint"},
	{"PathReportBatch", contract.PathReportBatch, "endpoint"},
	{"PathReportIssues", contract.PathReportIssues, "endpoint"},
	{"PathReportIssue", contract.PathReportIssue, "endpoint"},
	{"PathReportIssueUpdate", contract.PathReportIssueUpdate, "endpoint"},
	{"PathReportIssueComment", contract.PathReportIssueComment, "endpoint"},
}

// endpointComment parses the comment of a path constant:
// "POST CreateSessionRequest → 200 SessionStatus", "POST → 202
// InterruptResponse", "GET → text/event-stream of Event". The mint's comment
// is prose; it is handled separately.
var endpointComment = regexp.MustCompile(`^(GET|POST|PUT|PATCH|DELETE)\s+(?:(\w+)\s+)?→\s+(?:(\d{3})\s+(\w+)|text/event-stream of (\w+))$`)

func TestWorkerPathsDocumented(t *testing.T) {
	doc := loadDoc(t, workerDocPath)
	consts := contractConsts(t)
	listed := map[string]string{}
	for _, p := range workerPaths {
		listed[p.name] = p.value
	}
	inSource := sourceSet(consts, func(n string, _ constInfo) bool { return strings.HasPrefix(n, "Path") })
	if !maps.Equal(listed, inSource) {
		t.Fatalf("Path* constants in package contract %v differ from this test's list %v: add the new path here and to docs/openapi.yaml", inSource, listed)
	}
	documented := doc.Paths.Map()
	covered := map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}
	for _, p := range workerPaths {
		switch p.kind {
		case "endpoint":
			item := documented[p.value]
			if item == nil {
				t.Errorf("openapi.yaml: %s (%s) is not documented", p.value, p.name)
				continue
			}
			covered[p.value] = true
			if p.name == "PathMint" {
				ops := item.Operations()
				if len(ops) != 1 || ops["POST"] == nil {
					t.Errorf("openapi.yaml: %s must have exactly the operation POST, has %v", p.value, slices.Sorted(maps.Keys(ops)))
					continue
				}
				checkOperation(t, p.value, ops["POST"], "MintRequest", "200", "MintResponse", "")
				continue
			}
			// A comment names one operation, or several separated by "; ".
			var methods []string
			ops := item.Operations()
			for _, part := range strings.Split(consts[p.name].comment, "; ") {
				m := endpointComment.FindStringSubmatch(part)
				if m == nil {
					t.Errorf("contract.%s: comment %q is not of the form \"METHOD [Request] → status Response[; ...]\"", p.name, consts[p.name].comment)
					break
				}
				methods = append(methods, m[1])
				if ops[m[1]] == nil {
					t.Errorf("openapi.yaml: %s has no operation %s", p.value, m[1])
					continue
				}
				checkOperation(t, p.value, ops[m[1]], m[2], m[3], m[4], m[5])
			}
			if got := slices.Sorted(maps.Keys(ops)); !slices.Equal(got, slices.Sorted(slices.Values(methods))) {
				t.Errorf("openapi.yaml: %s documents operations %v, contract.%s names %v", p.value, got, p.name, methods)
			}
		case "prefix":
			n := 0
			for path, item := range documented {
				if strings.HasPrefix(path, p.value+"/") {
					n++
					covered[path] = true
					if ops := item.Operations(); len(ops) != 1 || ops[http.MethodPost] == nil {
						t.Errorf("openapi.yaml: %s must have exactly the operation POST", path)
					}
				}
			}
			if n == 0 {
				t.Errorf("openapi.yaml: no path under %s (%s)", p.value, p.name)
			}
		case "gateway":
			// An API path the gateway forwards: documented under its prefix.
			if documented[contract.PathGatewayPrefix+p.value] == nil {
				t.Errorf("openapi.yaml: %s%s (%s) is not documented", contract.PathGatewayPrefix, p.value, p.name)
			}
		case "group":
			// Covered by the endpoint constants; nothing else may be under it.
			for path := range documented {
				if strings.HasPrefix(path, p.value+"/") && !slices.ContainsFunc(workerPaths, func(q struct{ name, value, kind string }) bool { return q.value == path }) {
					t.Errorf("openapi.yaml documents %s under %s, which no path constant names", path, p.name)
				}
			}
		case "not built":
			for path := range documented {
				if strings.HasPrefix(path, p.value) {
					t.Errorf("openapi.yaml documents %s under %s, which this test lists as not built: update workerPaths", path, p.name)
				}
			}
		}
	}
	for path := range documented {
		if !covered[path] {
			t.Errorf("openapi.yaml documents %s, which no path constant of package contract names", path)
		}
	}
}

// checkOperation checks the request body and the success answer of op.
func checkOperation(t *testing.T, path string, op *openapi3.Operation, req, status, resp, stream string) {
	t.Helper()
	if req == "" {
		if op.RequestBody != nil {
			t.Errorf("openapi.yaml: %s documents a request body; the contract names none", path)
		}
	} else if op.RequestBody == nil || op.RequestBody.Value == nil || op.RequestBody.Value.Content["application/json"] == nil ||
		op.RequestBody.Value.Content["application/json"].Schema.Ref != schemaRefBase+req {
		t.Errorf("openapi.yaml: %s request body must be application/json $ref %s", path, req)
	}
	if stream != "" {
		status = "200"
	}
	r := op.Responses.Value(status)
	if r == nil || r.Value == nil {
		t.Errorf("openapi.yaml: %s has no %s answer", path, status)
		return
	}
	for code := range op.Responses.Map() {
		if strings.HasPrefix(code, "2") && code != status {
			t.Errorf("openapi.yaml: %s documents success %s besides %s", path, code, status)
		}
	}
	if stream != "" {
		if r.Value.Content["text/event-stream"] == nil {
			t.Errorf("openapi.yaml: %s must answer text/event-stream", path)
		}
		return
	}
	if mt := r.Value.Content["application/json"]; mt == nil || mt.Schema == nil || mt.Schema.Ref != schemaRefBase+resp {
		t.Errorf("openapi.yaml: %s %s answer must be application/json $ref %s", path, status, resp)
	}
}

// TestWorkerRoutesMatchDocument compares the routes internal/worker registers
// ("METHOD "+contract.PathX, or a literal "METHOD /path") with the document.
func TestWorkerRoutesMatchDocument(t *testing.T) {
	doc := loadDoc(t, workerDocPath)
	registered := routesIn(t, workerPkgDir)
	var documented []string
	for path, item := range doc.Paths.Map() {
		if len(item.Servers) > 0 {
			continue // a control-plane endpoint the worker calls
		}
		for m := range item.Operations() {
			documented = append(documented, m+" "+path)
		}
	}
	slices.Sort(documented)
	if !slices.Equal(registered, documented) {
		t.Errorf("internal/worker registers %v, openapi.yaml documents %v", registered, documented)
	}
}

// TestBrowserRoutesMatchDocument compares the browser routes
// internal/controlplane registers with docs/browser-openapi.yaml, and the
// control plane's browser request and answer types with their schemas.
func TestBrowserRoutesMatchDocument(t *testing.T) {
	doc := loadDoc(t, browserDocPath)
	var registered []string
	for _, r := range routesIn(t, controlPkgDir) {
		method, path, _ := strings.Cut(r, " ")
		if path == contract.PathMint || strings.HasPrefix(path, contract.PathGatewayPrefix) || strings.HasPrefix(path, contract.PathReportPrefix+"/") {
			continue // worker-facing, documented in openapi.yaml
		}
		if strings.HasPrefix(path, "/api/admin/") || path == "/metrics" {
			continue // operator-facing, documented in docs/budget-admin-api.md and the README
		}
		registered = append(registered, method+" "+strings.TrimSuffix(path, "{$}"))
	}
	slices.Sort(registered)
	var documented []string
	for path, item := range doc.Paths.Map() {
		for m := range item.Operations() {
			documented = append(documented, m+" "+path)
		}
	}
	slices.Sort(documented)
	if !slices.Equal(registered, documented) {
		t.Errorf("internal/controlplane registers %v, browser-openapi.yaml documents %v", registered, documented)
	}

	structs := structTagsIn(t, controlPkgDir)
	for goName, schema := range browserStructs {
		fields, ok := structs[goName]
		if !ok {
			t.Errorf("internal/controlplane has no struct %s any more: update browserStructs", goName)
			continue
		}
		s := schemaNamed(doc, schema)
		if s == nil {
			t.Errorf("browser-openapi.yaml: schema %s missing", schema)
			continue
		}
		if got, want := slices.Sorted(maps.Keys(s.Properties)), slices.Sorted(maps.Keys(fields)); !slices.Equal(got, want) {
			t.Errorf("browser-openapi.yaml: schema %s has properties %v, controlplane.%s has JSON fields %v", schema, got, goName, want)
		}
	}
	if s := schemaNamed(doc, "Conversation"); s != nil {
		if w := s.Properties["worker"]; w == nil || w.Ref != schemaRefBase+"SessionStatus" {
			t.Errorf("browser-openapi.yaml: Conversation.worker must be $ref SessionStatus")
		}
	}
}

var routePattern = regexp.MustCompile(`^(GET|POST|PUT|PATCH|DELETE) (/.*)$`)

// routesIn finds the ServeMux patterns registered in the Go files of dir: a
// first argument of a call that is a literal "METHOD /path" or "METHOD " +
// contract.PathX. It returns "METHOD /path" strings, sorted.
func routesIn(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, f := range parsePackage(t, dir) {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			if pattern, ok := routeArg(call.Args[0]); ok {
				if m := routePattern.FindStringSubmatch(pattern); m != nil {
					out = append(out, m[1]+" "+m[2])
				}
			}
			return true
		})
	}
	if len(out) == 0 {
		t.Fatalf("found no route registrations in %s: update routesIn", dir)
	}
	slices.Sort(out)
	return out
}

// routeArg evaluates a string literal, or a literal plus contract.PathX.
func routeArg(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != gotoken.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.BinaryExpr:
		if e.Op != gotoken.ADD {
			return "", false
		}
		left, ok := routeArg(e.X)
		if !ok {
			return "", false
		}
		sel, ok := e.Y.(*ast.SelectorExpr)
		if !ok {
			return "", false
		}
		if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "contract" {
			return "", false
		}
		for _, p := range workerPaths {
			if p.name == sel.Sel.Name {
				return left + p.value, true
			}
		}
	}
	return "", false
}

// structTagsIn returns, for each struct type declared in dir, its JSON member
// names (tag names; fields without a tag keep their Go name).
func structTagsIn(t *testing.T, dir string) map[string]map[string]bool {
	t.Helper()
	out := map[string]map[string]bool{}
	embeds := map[string][]string{} // struct -> structs of the package it embeds
	for _, f := range parsePackage(t, dir) {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			fields := map[string]bool{}
			for _, fl := range st.Fields.List {
				if id, ok := fl.Type.(*ast.Ident); ok && len(fl.Names) == 0 && fl.Tag == nil {
					embeds[ts.Name.Name] = append(embeds[ts.Name.Name], id.Name) // its fields are merged below
					continue
				}
				name := ""
				if fl.Tag != nil {
					tag, _ := strconv.Unquote(fl.Tag.Value)
					name, _, _ = strings.Cut(reflect.StructTag(tag).Get("json"), ",")
				}
				if name == "-" {
					continue
				}
				for _, id := range fl.Names {
					if !id.IsExported() {
						continue
					}
					if name != "" {
						fields[name] = true
					} else {
						fields[id.Name] = true
					}
				}
			}
			out[ts.Name.Name] = fields
			return true
		})
	}
	// An embedded struct's JSON fields are the embedding struct's too (one
	// level deep is all the package uses).
	for name, es := range embeds {
		for _, e := range es {
			for f := range out[e] {
				out[name][f] = true
			}
		}
	}
	return out
}

func TestConversationIDPatternDocumented(t *testing.T) {
	doc := loadDoc(t, workerDocPath)
	for _, name := range []string{"ConversationID", "ClientMessageID"} {
		s := schemaNamed(doc, name)
		if s == nil {
			t.Fatalf("openapi.yaml: schema %s missing", name)
		}
		re, err := regexp.Compile(s.Pattern)
		if err != nil {
			t.Fatalf("openapi.yaml: %s pattern: %v", name, err)
		}
		for _, id := range []string{"a", "c1", "2f0c6b8e-8a55-4a43-9a43-61b7f0e0c0de", "A_b-9", strings.Repeat("x", 64),
			"", "-a", "_a", "a/b", "a.b", "a b", "ä", strings.Repeat("x", 65), "a\n"} {
			ok := re.MatchString(id) && uint64(len(id)) >= s.MinLength && (s.MaxLength == nil || uint64(len(id)) <= *s.MaxLength)
			if want := contract.ValidConversationID(id) == nil; ok != want {
				t.Errorf("openapi.yaml: %s accepts %q: %v; contract.ValidConversationID: %v", name, id, ok, want)
			}
		}
	}
}

// TestRequestTokenSchemeAsDocumented signs a request token by hand, the way
// docs/worker-api.md §2 describes it, and checks that the worker's verifier
// accepts it; it also checks the document's worked example and constants.
func TestRequestTokenSchemeAsDocumented(t *testing.T) {
	md, err := os.ReadFile(workerMDPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(md)

	secret := make([]byte, 32)
	for i := range secret {
		secret[i] = byte(i)
	}
	master := token.MasterKey{ID: "k1", Secret: secret}
	key := master.Derive(token.PurposeWorkerRequest, "demo", "dev")
	if enc := base64.RawURLEncoding.EncodeToString(key.Secret); !strings.Contains(doc, "(base64url) `"+enc+"`") {
		t.Errorf("worker-api.md: the worked example must give the derived key %s", enc)
	}
	for _, s := range []string{
		"`talkide/v1/worker-request/<tenant>/<env>`",
		"`" + token.Issuer + "`",
		"`talkide-worker:<tenant>/<env>`",
		"`" + string(token.PurposeWorkerRequest) + "`",
		"`" + token.BodyHash(nil) + "`",
		"`iat + " + strconv.Itoa(int(token.RequestTokenTTL.Seconds())) + "`",
		"`now < exp + " + strconv.Itoa(int(token.DefaultClockSkew.Seconds())) + " s`",
	} {
		if !strings.Contains(doc, s) {
			t.Errorf("worker-api.md does not say %s", s)
		}
	}
	if token.Audience(token.PurposeWorkerRequest, "demo", "dev") != "talkide-worker:demo/dev" {
		t.Errorf("audience changed: %q; update worker-api.md and openapi.yaml", token.Audience(token.PurposeWorkerRequest, "demo", "dev"))
	}

	// Sign as documented: HS256 over base64url(header).base64url(claims).
	body := []byte(`{"client_message_id":"m1","user_id":"u1","text":"hi"}`)
	uri := "/v1/conversations/c1/messages"
	sum := sha256.Sum256(body)
	now := time.Now().Unix()
	sign := func(aud any, body []byte, jti string) string {
		header, _ := json.Marshal(map[string]any{"alg": "HS256", "kid": "k1", "typ": "JWT"})
		claims, _ := json.Marshal(map[string]any{
			"iss": "talkide-control-plane", "aud": aud, "sub": "demo/dev",
			"pur": "worker-request", "ten": "demo", "env": "dev",
			"htm": "POST", "htu": uri, "bh": hex.EncodeToString(sum[:]),
			"jti": jti, "iat": now, "nbf": now, "exp": now + 60,
		})
		in := base64.RawURLEncoding.EncodeToString(header) + "." + base64.RawURLEncoding.EncodeToString(claims)
		mac := hmac.New(sha256.New, key.Secret)
		mac.Write([]byte(in))
		return in + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	}
	v := token.NewVerifier(token.PurposeWorkerRequest, key).ForSubject("demo", "dev")
	replay := token.NewReplayCache()
	for i, aud := range []any{[]string{"talkide-worker:demo/dev"}, "talkide-worker:demo/dev"} {
		tok := sign(aud, body, "jti-"+strconv.Itoa(i))
		c, err := v.Verify(tok)
		if err != nil {
			t.Fatalf("a token signed as documented (aud %v) is refused: %v", aud, err)
		}
		if err := token.CheckRequest(c, http.MethodPost, uri, body); err != nil {
			t.Errorf("a token signed as documented does not match its request: %v", err)
		}
		if err := replay.Check(c); err != nil {
			t.Errorf("first use refused: %v", err)
		}
		if err := replay.Check(c); !errors.Is(err, token.ErrReplayed) {
			t.Errorf("second use of a token: got %v, want ErrReplayed", err)
		}
	}
	// Another tenant-env's worker refuses it.
	if _, err := token.NewVerifier(token.PurposeWorkerRequest, master.Derive(token.PurposeWorkerRequest, "demo", "prod")).ForSubject("demo", "prod").Verify(sign([]string{"talkide-worker:demo/dev"}, body, "x")); err == nil {
		t.Error("a demo/dev token is accepted by the demo/prod worker")
	}
}

// TestGoValuesValidateAgainstSchemas marshals typical values the way the
// servers do and validates them against the documented schemas, which checks
// types, formats and nullability beyond the property names.
func TestGoValuesValidateAgainstSchemas(t *testing.T) {
	usage := contract.Usage{InputTokens: 1200, OutputTokens: 80, CacheCreationInputTokens: 5, CacheReadInputTokens: 900}
	payloads := map[contract.EventType]any{
		contract.EventSessionStarted:   contract.SessionStarted{SessionID: "7c1e8f5e-0000-4000-8000-000000000001", Model: "claude-sonnet-4-5", WorkDir: "/data/claude/workspaces/c1", Resumed: true, ClaudeCodeVersion: "2.0.0"},
		contract.EventUserMessage:      contract.UserMessage{ClientMessageID: "m1", Text: "hi"},
		contract.EventTurnStarted:      contract.TurnStarted{ClientMessageID: "m1"},
		contract.EventAssistantText:    contract.AssistantText{MessageID: "msg_1", Text: "Hello."},
		contract.EventToolUse:          contract.ToolUse{ToolUseID: "toolu_1", Name: "Bash", Input: json.RawMessage(`{"command":"ls"}`)},
		contract.EventToolResult:       contract.ToolResult{ToolUseID: "toolu_1", Content: "a\nb", IsError: false},
		contract.EventAPIRetry:         contract.APIRetry{Attempt: 1, MaxRetries: 10, RetryDelayMS: 500, ErrorStatus: 529, Error: "server_error"},
		contract.EventTurnCompleted:    contract.TurnCompleted{ClientMessageID: "m1", Result: "done", Usage: usage, CostNanoUSD: 12_345_678, DurationMS: 4200, NumTurns: 2, StopReason: "end_turn"},
		contract.EventTurnFailed:       contract.TurnFailed{ClientMessageID: "m1", Reason: contract.FailAPIError, Message: "API Error: 429", APIErrorStatus: 429, Usage: usage},
		contract.EventError:            contract.ErrorEvent{Code: "store", Message: "disk full"},
		contract.EventSessionStopped:   contract.SessionStopped{Reason: "idle", ExitCode: -1},
		contract.EventMCPServerRefused: contract.MCPServerRefused{Server: "db", Transport: "stdio", Reason: "command psql is not allowed by TALKIDE_MCP_ALLOW_COMMANDS"},
		contract.EventLimitReached:     contract.LimitReached{Limit: contract.LimitMemory, Max: 2 << 30, Used: 1, Message: "the agent's processes reached their memory limit of 2048 MiB; the largest was ended"},
		contract.EventTurnQueued:       contract.TurnQueued{ClientMessageID: "m1", Position: 2, LiveProcesses: 4, MaxProcesses: 4},
		contract.EventPermissionRequested: contract.PermissionRequested{RequestID: "perm_1", ToolName: "Bash", ToolUseID: "toolu_1",
			Input: json.RawMessage(`{"command":"echo hi > out.txt"}`), ExpiresAt: time.Unix(1_800_000_000, 0).UTC()},
		contract.EventPermissionResolved: contract.PermissionResolved{RequestID: "perm_1", Behavior: "allow", Reason: "answered"},
		contract.EventBuildStarted:       contract.BuildStarted{BuildID: "toolu_2", Runner: "kubernetes", Tasks: []string{"test"}, Tests: "*Calculator*"},
		contract.EventBuildProgress:      contract.BuildProgress{BuildID: "toolu_2", State: contract.BuildQueued, QueuePlace: 2},
		contract.EventBuildCompleted: contract.BuildCompleted{BuildID: "toolu_2", Runner: "kubernetes", Phase: "failed", Reason: "ExitCode", ExitCode: 1,
			Tests: 12, Failures: 1, Skipped: 1, DurationMS: 41_000, LogTail: []string{"BUILD FAILED in 38s"},
			Failed: []contract.BuildTestFailure{{Class: "com.acme.CalculatorTest", Name: "divides()", Status: "failed", Type: "org.opentest4j.AssertionFailedError", Message: "expected: <2> but was: <0>"}}},
	}
	if len(payloads) != len(eventTypes) {
		t.Fatalf("payload samples for %d event types, want %d", len(payloads), len(eventTypes))
	}
	var events []any
	for i, e := range eventTypes {
		ev, err := contract.NewEvent("c1", e.value, payloads[e.value])
		if err != nil {
			t.Fatal(err)
		}
		ev.ID = int64(i + 1)
		events = append(events, ev)
	}
	// A turn_failed without an API status omits api_error_status.
	ev, _ := contract.NewEvent("c1", contract.EventTurnFailed, contract.TurnFailed{ClientMessageID: "m2", Reason: contract.FailInterrupted, Message: "stopped"})
	ev.ID = 99
	events = append(events, ev)
	// Log lines of a running build; the end of a build a restarted worker
	// followed again.
	for i, p := range []struct {
		t contract.EventType
		p any
	}{
		{contract.EventBuildProgress, contract.BuildProgress{BuildID: "toolu_2", State: contract.BuildRunning, PodPhase: "Running", Lines: []string{"> Task :test"}}},
		{contract.EventBuildProgress, contract.BuildProgress{BuildID: "toolu_2", Truncated: true}},
		{contract.EventBuildProgress, contract.BuildProgress{BuildID: "toolu_2", State: contract.BuildRunning, Resumed: true}},
		{contract.EventBuildCompleted, contract.BuildCompleted{BuildID: "toolu_2", Runner: "local", Phase: "failed", Reason: "WorkerRestarted", ExitCode: -1, Recovered: true}},
	} {
		ev, _ := contract.NewEvent("c1", p.t, p.p)
		ev.ID = int64(100 + i)
		events = append(events, ev)
	}

	status := contract.SessionStatus{ConversationID: "c1", UserID: "u1", State: contract.StateRunning, SessionID: "s", WorkDir: "/w", ProcessRunning: true, QueuedMessages: 1, LastEventID: 7}
	common := map[string][]any{
		"SessionStatus":       {status},
		"SendMessageResponse": {contract.SendMessageResponse{ClientMessageID: "m1", Duplicate: true}},
		"InterruptResponse":   {contract.InterruptResponse{Interrupted: false}},
		"ErrorBody":           {contract.ErrorBody{Error: contract.ErrorDetail{Type: contract.ErrTypeNotFound, Message: "conversation not found"}}},
		"AnyEvent":            events,
	}
	worker := maps.Clone(common)
	worker["CreateSessionRequest"] = []any{contract.CreateSessionRequest{UserID: "u1"}, contract.CreateSessionRequest{UserID: "u1", Model: "opus"}, contract.CreateSessionRequest{UserID: "u1", Sample: "java-calculator"}}
	worker["SendMessageRequest"] = []any{contract.SendMessageRequest{ClientMessageID: "m1", UserID: "u1", Text: "hi"}}
	worker["MintRequest"] = []any{contract.MintRequest{ConversationID: "c1"}}
	worker["SessionDeleted"] = []any{contract.SessionDeleted{ConversationID: "c1", AgentUIDReleased: true}}
	worker["MintResponse"] = []any{contract.MintResponse{Token: "a.b.c", ExpiresAt: time.Now().UTC().Truncate(time.Second)}}

	for docName, c := range map[string]struct {
		path   string
		values map[string][]any
	}{"openapi.yaml": {workerDocPath, worker}, "browser-openapi.yaml": {browserDocPath, common}} {
		doc := loadDoc(t, c.path)
		for schema, values := range c.values {
			s := schemaNamed(doc, schema)
			if s == nil {
				t.Errorf("%s: schema %s missing", docName, schema)
				continue
			}
			for _, v := range values {
				b, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				var generic any
				if err := json.Unmarshal(b, &generic); err != nil {
					t.Fatal(err)
				}
				if err := s.VisitJSON(generic); err != nil {
					t.Errorf("%s: %s does not accept %s: %v", docName, schema, b, err)
				}
			}
		}
	}
}
