package budget

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/talkide/talkide/internal/anthropic"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// goldenCost is what a golden stream must cost.
type goldenCost struct {
	Model                string `json:"model"`
	InputTokens          int64  `json:"input_tokens"`
	OutputTokens         int64  `json:"output_tokens"`
	CacheWrite5mTokens   int64  `json:"cache_write_5m_tokens"`
	CacheWrite1hTokens   int64  `json:"cache_write_1h_tokens"`
	CacheWriteTotal      int64  `json:"cache_creation_input_tokens"`
	CacheReadTokens      int64  `json:"cache_read_input_tokens"`
	Complete             bool   `json:"complete"`
	CostNanoUSD          int64  `json:"cost_nano_usd"`
	CostUSD              string `json:"cost_usd"`
	HandComputedNanoUSD  int64  `json:"hand_computed_nano_usd"`
	HandComputedFormulae string `json:"hand_computed"`
}

// handComputed are the costs worked out by hand from the list prices, so a
// golden file rewritten with -update cannot silently accept a wrong price.
var handComputed = map[string]struct {
	nano int64
	how  string
}{
	"cache_reads_and_writes":         {25_425_000, "sonnet-4-5: 100 in x $3 + 1500 5m x $3.75 + 500 1h x $6 + 30000 read x $0.30 + 500 out x $15"},
	"one_hour_writes":                {45_050_000, "opus-4-6: 10 in x $5 + 4000 1h x $10 + 200 out x $25"},
	"usage_only_in_delta":            {5_550_000, "haiku-4-5: 2000 in x $1 + 1000 unsplit writes at the 1h rate $2 + 500 read x $0.10 + 300 out x $5"},
	"usage_repeated_start_and_delta": {9_000_000, "opus-5-5: 1000 in x $4 (once, not twice) + 250 out x $20"},
	"haiku_5_5_long_prompt_tier":     {48_500_000, "haiku-5-5, prompt 110000 > 100k: every token at the tier: 90000 in x $0.50 + 20000 read x $0.05 + 1000 out x $2.50"},
}

// TestGoldenStreamCosts meters each testdata/golden/*.sse stream as the
// gateway does and prices it with the built-in table; the result must match
// the .golden.json file and the hand-computed cost.
func TestGoldenStreamCosts(t *testing.T) {
	files, _ := filepath.Glob("testdata/golden/*.sse")
	if len(files) != len(handComputed) {
		t.Fatalf("got %d golden streams, want %d", len(files), len(handComputed))
	}
	prices := DefaultPrices()
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".sse")
		t.Run(name, func(t *testing.T) {
			stream, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var m anthropic.StreamMeter
			m.Write(stream)
			u := m.Usage()
			p, known := prices.PriceFor(u.Model, at)
			if !known {
				t.Fatalf("model %q not in the built-in table", u.Model)
			}
			cost := p.Cost(anthropic.Usage{Model: u.Model, InputTokens: u.InputTokens, OutputTokens: u.BilledOutputTokens(u.Finished),
				CacheCreationInputTokens: u.CacheCreationInputTokens, CacheCreation5m: u.CacheCreation5m, CacheCreation1h: u.CacheCreation1h,
				CacheReadInputTokens: u.CacheReadInputTokens})
			cw5, cw1h := ledgerCacheWrites(u)
			hc := handComputed[name]
			got := goldenCost{Model: u.Model, InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, CacheWrite5mTokens: cw5, CacheWrite1hTokens: cw1h,
				CacheWriteTotal: u.CacheCreationInputTokens, CacheReadTokens: u.CacheReadInputTokens, Complete: u.Finished,
				CostNanoUSD: cost, CostUSD: FormatUSD(cost), HandComputedNanoUSD: hc.nano, HandComputedFormulae: hc.how}
			b, _ := json.MarshalIndent(got, "", "  ")
			b = append(b, '\n')
			golden := strings.TrimSuffix(f, ".sse") + ".golden.json"
			if *update {
				if err := os.WriteFile(golden, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update once to create it)", err)
			}
			if diff := cmp.Diff(string(want), string(b)); diff != "" {
				t.Errorf("golden mismatch (-want +got):\n%s", diff)
			}
			if cost != hc.nano {
				t.Errorf("cost: got %d nano-USD, hand-computed %d (%s)", cost, hc.nano, hc.how)
			}
			if !u.Finished {
				t.Errorf("stream not seen as complete")
			}
		})
	}
}

func TestPriceCost(t *testing.T) {
	p := DefaultPrices()
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	opus, ok := p.Lookup("claude-opus-5-5-20261001", at)
	if !ok {
		t.Fatal("claude-opus-5-5 not priced")
	}
	cases := []struct {
		name string
		u    anthropic.Usage
		want NanoUSD
	}{
		{"plain", anthropic.Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000}, 24_000_000_000},
		{"cache read and both writes", anthropic.Usage{CacheReadInputTokens: 1_000_000, CacheCreationInputTokens: 2_000_000, CacheCreation5m: 1_000_000, CacheCreation1h: 1_000_000}, 13_200_000_000},
		{"write without split at the 1h rate", anthropic.Usage{CacheCreationInputTokens: 1_000_000}, 8_000_000_000},
		{"split larger than the total is billed as split", anthropic.Usage{CacheCreationInputTokens: 10, CacheCreation5m: 1_000_000}, 5_000_000_000},
		{"remainder of a partial split at the 1h rate", anthropic.Usage{CacheCreationInputTokens: 2_000_000, CacheCreation5m: 1_000_000}, 13_000_000_000},
		{"one token rounds up", anthropic.Usage{InputTokens: 1}, 4_000},
		{"web searches at $10 per 1000", anthropic.Usage{WebSearchRequests: 3}, 30_000_000},
		{"absurd counts saturate", anthropic.Usage{OutputTokens: 1 << 62}, MaxCost},
		{"inference_geo us costs 1.1 times", anthropic.Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000, InferenceGeo: "us"}, 26_400_000_000},
		{"inference_geo global costs the list price", anthropic.Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000, InferenceGeo: "global"}, 24_000_000_000},
		{"one token in us rounds up", anthropic.Usage{InputTokens: 1, InferenceGeo: "us"}, 4_400},
		{"absurd counts in us saturate", anthropic.Usage{OutputTokens: 1 << 62, InferenceGeo: "us"}, MaxCost},
	}
	for _, tc := range cases {
		if got := opus.Cost(tc.u); got != tc.want {
			t.Errorf("%s: got %d, want %d", tc.name, got, tc.want)
		}
	}
	haiku, _ := p.Lookup("claude-haiku-5-5", at)
	if got := haiku.Cost(anthropic.Usage{InputTokens: 100_000, OutputTokens: 1_000_000}); got != 10_000_000+500_000_000 {
		t.Errorf("haiku 5.5 at exactly 100k prompt tokens: got %d, want the base tier 510000000", got)
	}
	if got := haiku.Cost(anthropic.Usage{InputTokens: 100_000, CacheReadInputTokens: 1, OutputTokens: 1_000_000}); got != 50_000_000+50+2_500_000_000 {
		t.Errorf("haiku 5.5 at 100001 prompt tokens: got %d, want the long-prompt tier for every token", got)
	}
}

func TestPriceLookupDatesAndPrecedence(t *testing.T) {
	p := DefaultPrices()
	before := time.Date(2026, 10, 6, 23, 59, 0, 0, time.UTC)
	after := time.Date(2026, 10, 7, 0, 0, 0, 0, time.UTC)
	if got, _ := p.Lookup("claude-sonnet-5-5", before); got.CacheRead != 200_000_000 {
		t.Errorf("sonnet 5.5 cache read before 2026-10-07: got %d, want $0.20", got.CacheRead)
	}
	if got, _ := p.Lookup("claude-sonnet-5-5", after); got.CacheRead != 100_000_000 {
		t.Errorf("sonnet 5.5 cache read from 2026-10-07: got %d, want $0.10", got.CacheRead)
	}
	if got, _ := p.Lookup("claude-opus-4-1-20250805", after); got.Input != 15*NanoPerUSD {
		t.Errorf("opus 4.1: got input %d, want $15 (longest prefix)", got.Input)
	}
	if got, _ := p.Lookup("claude-opus-4-5", after); got.Input != 5*NanoPerUSD {
		t.Errorf("opus 4.5: got input %d, want $5 (not the opus-4* prefix)", got.Input)
	}
	exact, err := ParsePriceTable([]byte(`{"format":1,"models":[
		{"model":"m*","input":"1","output":"1","cache_write_5m":"1","cache_write_1h":"1","cache_read":"1"},
		{"model":"m-special","input":"2","output":"2","cache_write_5m":"2","cache_write_1h":"2","cache_read":"2"},
		{"model":"m-special","effective":"2030-01-01","input":"3","output":"3","cache_write_5m":"3","cache_write_1h":"3","cache_read":"3"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := exact.Lookup("m-special", after); got.Input != 2*NanoPerUSD {
		t.Errorf("exact entry: got %d, want $2", got.Input)
	}
	if _, ok := exact.Lookup("x", after); ok {
		t.Error("unknown model found")
	}
	if d, known := exact.PriceFor("x", after); known || d.Input != 3*NanoPerUSD {
		t.Errorf("unknown model: got %d known=%v, want the dearest rate $3 (even a future row's)", d.Input, known)
	}
}

func TestUnknownModelNeverFree(t *testing.T) {
	p := DefaultPrices()
	d, known := p.PriceFor("my-custom-model", time.Now())
	if known {
		t.Fatal("unknown model reported as known")
	}
	u := anthropic.Usage{InputTokens: 1000, OutputTokens: 1000, CacheCreationInputTokens: 1000, CacheReadInputTokens: 1000}
	for _, m := range p.Models() {
		if k, _ := p.Lookup(strings.TrimSuffix(m, "*"), time.Now()); k.Cost(u) > d.Cost(u) {
			t.Errorf("unknown model costs %d, less than %s at %d", d.Cost(u), m, k.Cost(u))
		}
	}
	if p.Unknown != UnknownDearest {
		t.Errorf("default policy: got %q, want dearest", p.Unknown)
	}
}

func TestParsePriceTableErrors(t *testing.T) {
	row := `{"model":"m","input":"1","output":"1","cache_write_5m":"1","cache_write_1h":"1","cache_read":"1"}`
	for name, in := range map[string]string{
		"not JSON":          `nope`,
		"no format":         `{"models":[` + row + `]}`,
		"future format":     `{"format":2,"models":[` + row + `]}`,
		"no models":         `{"format":1,"models":[]}`,
		"unknown field":     `{"format":1,"models":[` + row + `],"x":1}`,
		"bad policy":        `{"format":1,"unknown_model":"free","models":[` + row + `]}`,
		"missing rate":      `{"format":1,"models":[{"model":"m","input":"1"}]}`,
		"float rate":        `{"format":1,"models":[{"model":"m","input":1,"output":"1","cache_write_5m":"1","cache_write_1h":"1","cache_read":"1"}]}`,
		"negative rate":     strings.Replace(`{"format":1,"models":[`+row+`]}`, `"input":"1"`, `"input":"-1"`, 1),
		"too many decimals": strings.Replace(`{"format":1,"models":[`+row+`]}`, `"input":"1"`, `"input":"0.0000000001"`, 1),
		"duplicate row":     `{"format":1,"models":[` + row + `,` + row + `]}`,
		"bad date":          strings.Replace(`{"format":1,"models":[`+row+`]}`, `"model":"m"`, `"model":"m","effective":"2026-13-01"`, 1),
		"star inside":       strings.Replace(`{"format":1,"models":[`+row+`]}`, `"model":"m"`, `"model":"m*x"`, 1),
		"tiers descending": `{"format":1,"models":[{"model":"m","input":"1","output":"1","cache_write_5m":"1","cache_write_1h":"1","cache_read":"1",
			"tiers":[{"above_prompt_tokens":10,"input":"1","output":"1","cache_write_5m":"1","cache_write_1h":"1","cache_read":"1"},
			{"above_prompt_tokens":5,"input":"1","output":"1","cache_write_5m":"1","cache_write_1h":"1","cache_read":"1"}]}]}`,
		"trailing data":        `{"format":1,"models":[` + row + `]} {}`,
		"geo factor below 1":   `{"format":1,"geo_multipliers":{"us":"0.5"},"models":[` + row + `]}`,
		"geo factor no number": `{"format":1,"geo_multipliers":{"us":"x"},"models":[` + row + `]}`,
		"geo without a name":   `{"format":1,"geo_multipliers":{"":"1.1"},"models":[` + row + `]}`,
	} {
		if _, err := ParsePriceTable([]byte(in)); !errors.Is(err, ErrBadPriceTable) {
			t.Errorf("%s: got %v, want ErrBadPriceTable", name, err)
		}
	}
}

func TestLoadPriceTableFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "prices.json")
	custom := bytes.Replace(DefaultPricesJSON(), []byte(`"unknown_model": "dearest"`), []byte(`"unknown_model": "deny"`), 1)
	if err := os.WriteFile(path, custom, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := LoadPriceTable(path)
	if err != nil || p.Unknown != UnknownDeny {
		t.Fatalf("got %v, %v; want the deny policy", p, err)
	}
	if _, err := LoadPriceTable(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("missing file accepted")
	}
}

func TestWorstCaseBoundsEveryCost(t *testing.T) {
	p := DefaultPrices()
	for _, m := range append(p.Models(), "unknown-model") {
		price, _ := p.PriceFor(strings.TrimSuffix(m, "*"), time.Now())
		const prompt, maxOut = 150_000, 4_000
		worst := price.WorstCase(prompt, maxOut)
		for _, u := range []anthropic.Usage{
			{InputTokens: prompt, OutputTokens: maxOut},
			{CacheCreationInputTokens: prompt, CacheCreation1h: prompt, OutputTokens: maxOut},
			{CacheCreationInputTokens: prompt, OutputTokens: maxOut},
			{CacheReadInputTokens: prompt, OutputTokens: maxOut},
			{InputTokens: 1, CacheCreationInputTokens: prompt - 1, CacheCreation5m: prompt - 1, OutputTokens: maxOut},
			{CacheCreationInputTokens: prompt, CacheCreation1h: prompt, OutputTokens: maxOut, InferenceGeo: "us"},
		} {
			if c := price.Cost(u); c > worst {
				t.Errorf("%s: usage %+v costs %d, above the worst case %d", m, u, c, worst)
			}
		}
	}
}

func TestMoney(t *testing.T) {
	for in, want := range map[string]NanoUSD{"0": 0, "12": 12 * NanoPerUSD, "0.5": 500_000_000, "0.000000001": 1, "100.25": 100_250_000_000} {
		got, err := ParseUSD(in)
		if err != nil || got != want {
			t.Errorf("ParseUSD(%q) = %d, %v; want %d", in, got, err, want)
		}
		if back := FormatUSD(got); back != strings.TrimSuffix(in, "0") && in != "0" {
			t.Errorf("FormatUSD(%d) = %q, want %q", got, back, in)
		}
	}
	for _, bad := range []string{"", "-1", "+1", "1.", ".5", "1e3", "1,5", " 1", "0x10", "1.0000000001", "99999999999999999999", "1152921505"} {
		if _, err := ParseUSD(bad); !errors.Is(err, ErrBadAmount) {
			t.Errorf("ParseUSD(%q): got %v, want ErrBadAmount", bad, err)
		}
	}
	if got := FormatUSD(-1_500_000_000); got != "-1.5" {
		t.Errorf("FormatUSD(-1.5 USD) = %q", got)
	}
}

func FuzzParsePriceTable(f *testing.F) {
	f.Add(DefaultPricesJSON())
	f.Add([]byte(`{"format":1,"models":[{"model":"m*","input":"1","output":"1","cache_write_5m":"1","cache_write_1h":"1","cache_read":"1","tiers":[{"above_prompt_tokens":1,"input":"2","output":"2","cache_write_5m":"2","cache_write_1h":"2","cache_read":"2"}]}]}`))
	f.Add([]byte(`{"format":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePriceTable(b)
		if err != nil {
			if !errors.Is(err, ErrBadPriceTable) {
				t.Fatalf("error %v does not wrap ErrBadPriceTable", err)
			}
			return
		}
		// A table that parses never prices a call at zero when its rates are
		// positive, and never below the cheapest of them.
		d := p.Dearest()
		for _, m := range p.Models() {
			price, _ := p.Lookup(strings.TrimSuffix(m, "*"), time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC))
			if price.Input > d.Input || price.Output > d.Output {
				t.Fatalf("%s dearer than the dearest", m)
			}
		}
		if p.Unknown != UnknownDearest && p.Unknown != UnknownDeny {
			t.Fatalf("policy %q", p.Unknown)
		}
	})
}

func FuzzParseUSD(f *testing.F) {
	for _, s := range []string{"0", "12.5", "0.000000001", "1e3", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseUSD(s)
		if err != nil {
			return
		}
		if n < 0 || n > MaxCost {
			t.Fatalf("ParseUSD(%q) = %d out of range", s, n)
		}
		if back, err := ParseUSD(FormatUSD(n)); err != nil || back != n {
			t.Fatalf("round trip of %q: %d → %q → %d, %v", s, n, FormatUSD(n), back, err)
		}
	})
}

// TestWorstCaseWithToolsBoundsServerToolCalls: case M3's call (a 200-byte
// body with web search, billed 25 000 input tokens, 500 output and 3
// searches) costs no more than its worst case, whatever server tools it
// declares; unknown tool types are priced as the dearest listed.
func TestWorstCaseWithToolsBoundsServerToolCalls(t *testing.T) {
	p := DefaultPrices()
	price, _ := p.PriceFor("claude-3-haiku-20240307", time.Now())
	u := anthropic.Usage{Model: "claude-3-haiku-20240307", InputTokens: 25_000, OutputTokens: 500, WebSearchRequests: 3}
	const prompt = 200/3 + 1
	for _, tools := range [][]anthropic.ServerTool{
		{{Type: "web_search_20250305", MaxUses: 5}},
		{{Type: "web_search_20250305"}},
		{{Type: "web_search_20250305", MaxUses: 3}},
		{{Type: "future_tool_20270101"}, {Type: "web_search_20250305", MaxUses: 3}},
	} {
		tb, _ := p.ServerTools(tools, 0)
		if w := price.WorstCaseWithTools(prompt, 1024, tb); w < price.Cost(u) {
			t.Errorf("tools %+v: worst case %d below the cost %d of the usage the upstream reports", tools, w, price.Cost(u))
		}
	}
	if _, known := p.ServerTools([]anthropic.ServerTool{{Type: "future_tool_20270101"}}, 0); known {
		t.Error("an unlisted server tool reported as known")
	}
	unknown, _ := p.ServerTools([]anthropic.ServerTool{{Type: "future_tool_20270101", MaxUses: 1}}, 0)
	for _, typ := range []string{"web_search_20250305", "web_fetch_20250910", "code_execution_20250825", "mcp_toolset"} {
		known, ok := p.ServerTools([]anthropic.ServerTool{{Type: typ, MaxUses: 1}}, 0)
		if !ok || known.ResultTokens > unknown.ResultTokens || known.Fees > unknown.Fees+price.WebSearch {
			t.Errorf("%s: bound %+v (known %v), want it listed and no dearer than an unknown tool's %+v", typ, known, ok, unknown)
		}
	}
	if tb, _ := p.ServerTools(nil, 0); price.WorstCaseWithTools(prompt, 1024, tb) != price.WorstCase(prompt, 1024) {
		t.Error("no server tools: WorstCaseWithTools differs from WorstCase")
	}
	huge, _ := p.ServerTools([]anthropic.ServerTool{{Type: "web_fetch_20250910", MaxUses: 1 << 62, MaxContentTokens: 1 << 62}}, 1<<20)
	if w := price.WorstCaseWithTools(1<<40, 1<<24, huge); w <= 0 || w > MaxCost {
		t.Errorf("absurd tool bounds: worst case %d, want positive and at most MaxCost", w)
	}
}

func TestParsePriceTableServerTools(t *testing.T) {
	base := `{"format":1,"models":[{"model":"m","input":"1","output":"1","cache_write_5m":"1","cache_write_1h":"1","cache_read":"1"}],"server_tools":[%s]}`
	for _, bad := range []string{
		`{"type":"","per_use_usd":"0","input_tokens_per_use":1}`,
		`{"type":"web_search_*","per_use_usd":"-1","input_tokens_per_use":1}`,
		`{"type":"web_search_*","per_use_usd":"0","input_tokens_per_use":-1}`,
		`{"type":"bash_20250124","per_use_usd":"0","input_tokens_per_use":1}`,
		`{"type":"x*","per_use_usd":"0","input_tokens_per_use":1},{"type":"x*","per_use_usd":"0","input_tokens_per_use":1}`,
		`{"type":"x","per_use_usd":"0","input_tokens_per_use":1,"extra":1}`,
	} {
		if _, err := ParsePriceTable([]byte(fmt.Sprintf(base, bad))); !errors.Is(err, ErrBadPriceTable) {
			t.Errorf("server_tools %s: got %v, want ErrBadPriceTable", bad, err)
		}
	}
	p, err := ParsePriceTable([]byte(fmt.Sprintf(base, "")))
	if err != nil {
		t.Fatal(err)
	}
	if got, known := p.ServerTool("web_search_20250305"); known || got != fallbackServerTool {
		t.Errorf("a table without server_tools: got %+v (known %v), want the fallback %+v", got, known, fallbackServerTool)
	}
}
