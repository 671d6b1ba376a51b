package budget

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
)

// Rates are a model's prices in nano-USD per million tokens (so $4.00 per
// MTok is 4_000_000_000), one per kind of token.
type Rates struct {
	Input        NanoUSD
	Output       NanoUSD
	CacheWrite5m NanoUSD
	CacheWrite1h NanoUSD
	CacheRead    NanoUSD
}

// Tier replaces the base rates for every token of a call whose prompt
// (input + cache writes + cache reads) is longer than AbovePromptTokens.
type Tier struct {
	AbovePromptTokens int64
	Rates
}

// Price is what a model costs at one date: base rates, optional prompt-length
// tiers (ascending), and the price of a web search request in nano-USD.
type Price struct {
	Rates
	Tiers     []Tier
	WebSearch NanoUSD
	// geo maps a usage.inference_geo to the factor, in billionths, that
	// every amount of a call run there is multiplied by (the table's
	// geo_multipliers: "us" 1.1 is 1_100_000_000).
	geo map[string]int64
}

// UnknownModelPolicy says what happens to a call for a model the price table
// does not list. No policy makes it free.
type UnknownModelPolicy string

const (
	// UnknownDearest prices the call at the dearest rate of every kind in
	// the table (the default).
	UnknownDearest UnknownModelPolicy = "dearest"
	// UnknownDeny refuses the call before it is forwarded. A response that
	// names an unknown model (the request's model was known) is priced as
	// UnknownDearest, since it can no longer be refused.
	UnknownDeny UnknownModelPolicy = "deny"
)

// PriceTable maps model ids to dated prices. Entries name a model exactly or
// by prefix ("claude-sonnet-4*"); an exact entry beats a prefix, a longer
// prefix beats a shorter one, and among a model's entries the one with the
// latest effective date not after the call applies. Safe for concurrent use;
// immutable once built.
type PriceTable struct {
	entries []priceEntry
	// Unknown is the policy for models no entry matches.
	Unknown UnknownModelPolicy
	dearest Price
	geo     map[string]int64
	// tools are the server-tool prices (servertool.go); dearestTool
	// prices a tool type none of them matches.
	tools       []serverToolEntry
	dearestTool ServerToolPrice
}

type priceEntry struct {
	pattern   string // without the '*'
	prefix    bool
	effective time.Time
	price     Price
}

//go:embed default_prices.json
var defaultPricesJSON []byte

// DefaultPrices returns the built-in table: Anthropic list prices as of
// 2026-11 (default_prices.json, the same format as TALKIDE_PRICES_FILE).
func DefaultPrices() *PriceTable {
	t, err := ParsePriceTable(defaultPricesJSON)
	if err != nil {
		panic("budget: built-in price table: " + err.Error()) // a test guards the file
	}
	return t
}

// DefaultPricesJSON returns the built-in table's file, a starting point for
// an operator's own.
func DefaultPricesJSON() []byte { return bytes.Clone(defaultPricesJSON) }

// priceFile is the JSON form of a PriceTable (format 1). Amounts are decimal
// strings of US dollars per million tokens ("0.125"), so they are exact.
type priceFile struct {
	Format       int                `json:"format"`
	Comment      string             `json:"comment,omitempty"`
	UnknownModel UnknownModelPolicy `json:"unknown_model,omitempty"`
	// WebSearchPer1k is the price of 1000 web searches in USD, for every
	// model without its own.
	WebSearchPer1k string `json:"web_search_per_1k,omitempty"`
	// GeoMultipliers maps a usage.inference_geo ("us") to a decimal factor
	// ("1.1") applied to every amount of a call run there.
	GeoMultipliers map[string]string `json:"geo_multipliers,omitempty"`
	// ServerTools price server tools in worst cases (servertool.go).
	ServerTools []serverToolJSON `json:"server_tools,omitempty"`
	Models      []priceJSON      `json:"models"`
}

type ratesJSON struct {
	Input        string `json:"input"`
	Output       string `json:"output"`
	CacheWrite5m string `json:"cache_write_5m"`
	CacheWrite1h string `json:"cache_write_1h"`
	CacheRead    string `json:"cache_read"`
}

type priceJSON struct {
	Model string `json:"model"`
	// Effective is the first UTC day ("2026-10-07") the row applies; empty
	// means always.
	Effective string `json:"effective,omitempty"`
	ratesJSON
	Tiers []struct {
		AbovePromptTokens int64 `json:"above_prompt_tokens"`
		ratesJSON
	} `json:"tiers,omitempty"`
	WebSearchPer1k string `json:"web_search_per_1k,omitempty"`
}

// ErrBadPriceTable is wrapped by every ParsePriceTable error.
var ErrBadPriceTable = errors.New("bad price table")

// LoadPriceTable reads a price table file (see ParsePriceTable).
func LoadPriceTable(path string) (*PriceTable, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load price table: %w", err)
	}
	t, err := ParsePriceTable(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// ParsePriceTable parses a price table file: format 1, unknown_model
// ("dearest" or "deny"), and models with decimal-dollar rates per million
// tokens. Every rate of a row is required; unknown fields, a missing or
// different format, duplicate (model, effective) rows, tiers out of order and
// amounts that are not exact decimals are errors wrapping ErrBadPriceTable.
func ParsePriceTable(b []byte) (*PriceTable, error) {
	var f priceFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadPriceTable, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data", ErrBadPriceTable)
	}
	if f.Format != 1 {
		return nil, fmt.Errorf("%w: format %d: this gateway reads format 1", ErrBadPriceTable, f.Format)
	}
	t := &PriceTable{Unknown: f.UnknownModel}
	switch t.Unknown {
	case "":
		t.Unknown = UnknownDearest
	case UnknownDearest, UnknownDeny:
	default:
		return nil, fmt.Errorf("%w: unknown_model %q: want dearest or deny", ErrBadPriceTable, f.UnknownModel)
	}
	var defaultSearch NanoUSD
	if f.WebSearchPer1k != "" {
		v, err := ParseUSD(f.WebSearchPer1k)
		if err != nil {
			return nil, fmt.Errorf("%w: web_search_per_1k: %v", ErrBadPriceTable, err)
		}
		defaultSearch = (v + 999) / 1000
	}
	for geo, m := range f.GeoMultipliers {
		v, err := ParseUSD(m)
		if err != nil || v < NanoPerUSD || v > 100*NanoPerUSD || geo == "" {
			return nil, fmt.Errorf("%w: geo_multipliers[%q] = %q: want a decimal factor from 1 to 100", ErrBadPriceTable, geo, m)
		}
		if t.geo == nil {
			t.geo = map[string]int64{}
		}
		t.geo[geo] = int64(v) // a factor of 1 is NanoPerUSD billionths
	}
	if len(f.Models) == 0 {
		return nil, fmt.Errorf("%w: no models", ErrBadPriceTable)
	}
	seen := map[string]bool{}
	for i, m := range f.Models {
		e, err := m.entry(defaultSearch)
		if err != nil {
			return nil, fmt.Errorf("%w: models[%d] (%q): %v", ErrBadPriceTable, i, m.Model, err)
		}
		key := m.Model + "@" + e.effective.Format(time.DateOnly)
		if seen[key] {
			return nil, fmt.Errorf("%w: models[%d]: %q effective %s listed twice", ErrBadPriceTable, i, m.Model, e.effective.Format(time.DateOnly))
		}
		seen[key] = true
		t.entries = append(t.entries, e)
	}
	seenTool := map[string]bool{}
	for i, st := range f.ServerTools {
		e, err := st.entry()
		if err != nil {
			return nil, fmt.Errorf("%w: server_tools[%d] (%q): %v", ErrBadPriceTable, i, st.Type, err)
		}
		if seenTool[st.Type] {
			return nil, fmt.Errorf("%w: server_tools[%d]: %q listed twice", ErrBadPriceTable, i, st.Type)
		}
		seenTool[st.Type] = true
		t.tools = append(t.tools, e)
	}
	t.dearestTool = dearestToolOf(t.tools)
	t.dearest = dearestOf(t.entries)
	t.dearest.geo = t.geo
	return t, nil
}

func (r ratesJSON) parse() (Rates, error) {
	var out Rates
	for _, f := range []struct {
		name string
		s    string
		dst  *NanoUSD
	}{
		{"input", r.Input, &out.Input}, {"output", r.Output, &out.Output},
		{"cache_write_5m", r.CacheWrite5m, &out.CacheWrite5m}, {"cache_write_1h", r.CacheWrite1h, &out.CacheWrite1h},
		{"cache_read", r.CacheRead, &out.CacheRead},
	} {
		if f.s == "" {
			return Rates{}, fmt.Errorf("%s: missing", f.name)
		}
		v, err := ParseUSD(f.s)
		if err != nil {
			return Rates{}, fmt.Errorf("%s: %v", f.name, err)
		}
		if v > 1_000_000*NanoPerUSD {
			return Rates{}, fmt.Errorf("%s: %s USD per million tokens is implausibly high", f.name, f.s)
		}
		*f.dst = v
	}
	return out, nil
}

func (m priceJSON) entry(defaultSearch NanoUSD) (priceEntry, error) {
	e := priceEntry{pattern: m.Model}
	e.pattern, e.prefix = strings.CutSuffix(m.Model, "*")
	if e.pattern == "" && !e.prefix || strings.Contains(e.pattern, "*") {
		return e, errors.New("model: want an id or a prefix ending in '*'")
	}
	if m.Effective != "" {
		d, err := time.Parse(time.DateOnly, m.Effective)
		if err != nil {
			return e, fmt.Errorf("effective: want YYYY-MM-DD: %v", err)
		}
		e.effective = d
	}
	r, err := m.ratesJSON.parse()
	if err != nil {
		return e, err
	}
	e.price = Price{Rates: r, WebSearch: defaultSearch}
	if m.WebSearchPer1k != "" {
		v, err := ParseUSD(m.WebSearchPer1k)
		if err != nil {
			return e, fmt.Errorf("web_search_per_1k: %v", err)
		}
		e.price.WebSearch = (v + 999) / 1000
	}
	last := int64(0)
	for j, tj := range m.Tiers {
		if tj.AbovePromptTokens <= last {
			return e, fmt.Errorf("tiers[%d]: above_prompt_tokens must be positive and ascending", j)
		}
		last = tj.AbovePromptTokens
		tr, err := tj.ratesJSON.parse()
		if err != nil {
			return e, fmt.Errorf("tiers[%d]: %v", j, err)
		}
		e.price.Tiers = append(e.price.Tiers, Tier{AbovePromptTokens: tj.AbovePromptTokens, Rates: tr})
	}
	return e, nil
}

// dearestOf is the fail-closed price: per kind, the highest rate of any
// entry or tier.
func dearestOf(es []priceEntry) Price {
	var d Price
	up := func(r Rates) {
		d.Input = max(d.Input, r.Input)
		d.Output = max(d.Output, r.Output)
		d.CacheWrite5m = max(d.CacheWrite5m, r.CacheWrite5m)
		d.CacheWrite1h = max(d.CacheWrite1h, r.CacheWrite1h)
		d.CacheRead = max(d.CacheRead, r.CacheRead)
	}
	for _, e := range es {
		up(e.price.Rates)
		for _, t := range e.price.Tiers {
			up(t.Rates)
		}
		d.WebSearch = max(d.WebSearch, e.price.WebSearch)
	}
	return d
}

// Lookup returns the price of model at time at: see PriceTable for the
// matching rules. ok is false when no entry matches.
func (t *PriceTable) Lookup(model string, at time.Time) (Price, bool) {
	best := -1
	rank := func(e priceEntry) int { // exact beats any prefix; longer prefix beats shorter
		if !e.prefix {
			return 1 << 30
		}
		return len(e.pattern)
	}
	for i, e := range t.entries {
		if e.prefix && !strings.HasPrefix(model, e.pattern) || !e.prefix && model != e.pattern {
			continue
		}
		if e.effective.After(at) {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := t.entries[best]
		if r, rb := rank(e), rank(b); r > rb || r == rb && e.effective.After(b.effective) {
			best = i
		}
	}
	if best < 0 {
		return Price{}, false
	}
	p := t.entries[best].price
	p.geo = t.geo
	return p, true
}

// PriceFor returns the model's price at time at, or, for a model the table
// does not know, the dearest rates of the table (known=false). Callers
// applying UnknownDeny check known themselves.
func (t *PriceTable) PriceFor(model string, at time.Time) (p Price, known bool) {
	if p, ok := t.Lookup(model, at); ok {
		return p, true
	}
	return t.dearest, false
}

// Dearest returns the fail-closed price (per kind, the highest rate in the
// table).
func (t *PriceTable) Dearest() Price { return t.dearest }

// Models lists the table's model patterns, for diagnostics.
func (t *PriceTable) Models() []string {
	var out []string
	for _, e := range t.entries {
		p := e.pattern
		if e.prefix {
			p += "*"
		}
		out = append(out, p)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// costOf returns tokens × rate (nano-USD per MTok), rounded up to whole
// nano-USD. Results saturate at MaxCost instead of overflowing, so an absurd
// token count (a hostile max_tokens) can only ever make a call dearer.
func costOf(tokens int64, rate NanoUSD) NanoUSD {
	if tokens <= 0 || rate <= 0 {
		return 0
	}
	if tokens > (MaxCost-999_999)/rate {
		return MaxCost
	}
	return (tokens*rate + 999_999) / 1_000_000
}

// addCost adds amounts, saturating at MaxCost.
func addCost(parts ...NanoUSD) NanoUSD {
	var sum NanoUSD
	for _, p := range parts {
		sum += min(max(p, 0), MaxCost)
		if sum >= MaxCost {
			return MaxCost
		}
	}
	return sum
}

// rates returns the rates that apply to a call with prompt tokens.
func (p Price) rates(prompt int64) Rates {
	r := p.Rates
	for _, t := range p.Tiers {
		if prompt > t.AbovePromptTokens {
			r = t.Rates
		}
	}
	return r
}

// Cost prices a call's usage in nano-USD, rounding each kind up. The tier is
// chosen by the prompt length (input + cache writes + cache reads) and
// applies to every token. Cache writes without a TTL split, or the part of
// cache_creation_input_tokens the split does not explain, are priced at the
// 1-hour rate (the dearer one): a policy choice, since message_delta carries
// no split.
func (p Price) Cost(u anthropic.Usage) NanoUSD {
	split := max(u.CacheCreation5m, 0) + max(u.CacheCreation1h, 0)
	writes := max(u.CacheCreationInputTokens, split)
	r := p.rates(u.InputTokens + writes + u.CacheReadInputTokens)
	cost := addCost(
		costOf(u.InputTokens, r.Input),
		costOf(u.OutputTokens, r.Output),
		costOf(u.CacheReadInputTokens, r.CacheRead),
		costOf(u.CacheCreation5m, r.CacheWrite5m),
		costOf(u.CacheCreation1h, r.CacheWrite1h),
		costOf(writes-split, r.CacheWrite1h),
		costOf(u.WebSearchRequests*1_000_000, p.WebSearch),
	)
	return scale(cost, p.geo[u.InferenceGeo])
}

// scale multiplies a by factor billionths (0: unchanged), rounding up and
// saturating at MaxCost.
func scale(a NanoUSD, factor int64) NanoUSD {
	if factor <= 0 || a <= 0 {
		return a
	}
	hi, lo := bits.Mul64(uint64(a), uint64(factor))
	if hi >= uint64(NanoPerUSD) { // the quotient would not fit in 64 bits
		return MaxCost
	}
	q, r := bits.Div64(hi, lo, uint64(NanoPerUSD))
	if r > 0 {
		q++
	}
	return NanoUSD(min(q, uint64(MaxCost)))
}

// WorstCase is the most a call can cost in nano-USD: every prompt token
// (promptTokens, an over-estimate) at the dearest input-side rate (usually
// a 1-hour cache write) plus maxTokens of output, at the tier promptTokens
// falls in (tiers only grow with the prompt, so an over-estimate of the
// prompt never picks a cheaper tier), at the dearest geo (the call may run
// in any). A call with server tools needs WorstCaseWithTools.
func (p Price) WorstCase(promptTokens, maxTokens int64) NanoUSD {
	r := p.rates(promptTokens)
	in := max(r.Input, r.CacheWrite5m, r.CacheWrite1h, r.CacheRead)
	return scale(addCost(costOf(promptTokens, in), costOf(maxTokens, r.Output)), p.dearestGeo())
}
