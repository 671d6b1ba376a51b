package budget

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/talkide/talkide/internal/anthropic"
)

// NanoUSD is an amount of money in 10⁻⁹ US dollars.
type NanoUSD = int64

// Price holds a model's rates in nano-USD per million tokens (so $4.00 per
// MTok is 4_000_000_000).
type Price struct {
	Input        NanoUSD `json:"input"`
	Output       NanoUSD `json:"output"`
	CacheWrite5m NanoUSD `json:"cache_write_5m"`
	CacheWrite1h NanoUSD `json:"cache_write_1h"`
	CacheRead    NanoUSD `json:"cache_read"`
}

// usd converts dollars per MTok to nano-USD per MTok (exact for the
// table's decimals).
func usd(dollars float64) NanoUSD { return NanoUSD(dollars*1e9 + 0.5) }

// PriceTable maps a model id (or a prefix ending in '*') to its price.
type PriceTable map[string]Price

// DefaultPrices are Anthropic list prices per model family as of 2026-11
// (shared/research/anthropic-api.md §4.7).
func DefaultPrices() PriceTable {
	return PriceTable{
		"claude-fable-5-1*":  {usd(10), usd(50), usd(12.5), usd(20), usd(0.25)},
		"claude-fable-5*":    {usd(10), usd(50), usd(12.5), usd(20), usd(1)},
		"claude-mythos-5-1*": {usd(10), usd(50), usd(12.5), usd(20), usd(0.25)},
		"claude-mythos-5*":   {usd(10), usd(50), usd(12.5), usd(20), usd(1)},
		"claude-opus-5-5*":   {usd(4), usd(20), usd(5), usd(8), usd(0.2)},
		"claude-opus-5*":     {usd(5), usd(25), usd(6.25), usd(10), usd(0.5)},
		"claude-opus-4-8*":   {usd(5), usd(25), usd(6.25), usd(10), usd(0.5)},
		"claude-opus-4-7*":   {usd(5), usd(25), usd(6.25), usd(10), usd(0.5)},
		"claude-opus-4-6*":   {usd(5), usd(25), usd(6.25), usd(10), usd(0.5)},
		"claude-opus-4-5*":   {usd(5), usd(25), usd(6.25), usd(10), usd(0.5)},
		"claude-opus-4-1*":   {usd(15), usd(75), usd(18.75), usd(30), usd(1.5)},
		"claude-opus-4*":     {usd(15), usd(75), usd(18.75), usd(30), usd(1.5)},
		"claude-sonnet-5-5*": {usd(2), usd(10), usd(2.5), usd(4), usd(0.1)},
		"claude-sonnet-5*":   {usd(2), usd(10), usd(2.5), usd(4), usd(0.2)},
		"claude-sonnet-4*":   {usd(3), usd(15), usd(3.75), usd(6), usd(0.3)},
		"claude-haiku-5-5*":  {usd(0.5), usd(2.5), usd(0.625), usd(1), usd(0.05)}, // the >100k-token tier: conservative until tiers land
		"claude-haiku-4-5*":  {usd(1), usd(5), usd(1.25), usd(2), usd(0.1)},
		"claude-haiku-3-5*":  {usd(0.8), usd(4), usd(1), usd(1.6), usd(0.08)},
		"claude-3-haiku*":    {usd(0.25), usd(1.25), usd(0.3), usd(0.5), usd(0.03)},
	}
}

// ParsePriceTable reads a JSON object of model → Price (nano-USD per MTok).
func ParsePriceTable(b []byte) (PriceTable, error) {
	var t PriceTable
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("parse price table: %w", err)
	}
	if len(t) == 0 {
		return nil, fmt.Errorf("parse price table: no models")
	}
	return t, nil
}

// Lookup returns the price of model: an exact entry, else the longest
// matching prefix entry, else ok=false.
func (t PriceTable) Lookup(model string) (Price, bool) {
	if p, ok := t[model]; ok {
		return p, true
	}
	best, bestLen := Price{}, -1
	for k, p := range t {
		prefix, isPrefix := strings.CutSuffix(k, "*")
		if isPrefix && strings.HasPrefix(model, prefix) && len(prefix) > bestLen {
			best, bestLen = p, len(prefix)
		}
	}
	return best, bestLen >= 0
}

// Dearest returns, per rate, the highest rate of the table: the fail-closed
// price of an unknown model.
func (t PriceTable) Dearest() Price {
	var d Price
	for _, p := range t {
		d.Input = max(d.Input, p.Input)
		d.Output = max(d.Output, p.Output)
		d.CacheWrite5m = max(d.CacheWrite5m, p.CacheWrite5m)
		d.CacheWrite1h = max(d.CacheWrite1h, p.CacheWrite1h)
		d.CacheRead = max(d.CacheRead, p.CacheRead)
	}
	return d
}

// PriceFor returns the model's price, or the dearest when unknown.
func (t PriceTable) PriceFor(model string) (p Price, known bool) {
	if p, ok := t.Lookup(model); ok {
		return p, true
	}
	return t.Dearest(), false
}

// costOf returns tokens × rate (nano-USD per MTok), rounded up to whole nano-USD.
//
// Results saturate at MaxCost instead of overflowing, so an absurd token
// count (a hostile max_tokens) can only ever make a call dearer.
func costOf(tokens int64, rate NanoUSD) NanoUSD {
	if tokens <= 0 || rate <= 0 {
		return 0
	}
	if tokens > (MaxCost-999_999)/rate {
		return MaxCost
	}
	return (tokens*rate + 999_999) / 1_000_000
}

// MaxCost caps every computed amount (about 1.15 billion USD): far above any
// limit, far below int64 overflow even when several are added.
const MaxCost NanoUSD = math.MaxInt64 / 8

// addCost adds amounts, saturating at MaxCost.
func addCost(parts ...NanoUSD) NanoUSD {
	var sum NanoUSD
	for _, p := range parts {
		sum += min(p, MaxCost)
		if sum >= MaxCost {
			return MaxCost
		}
	}
	return sum
}

// Cost prices a call's usage. Cache writes without a TTL split (or whose
// split does not add up) are priced at the 1-hour rate, the dearer one.
func (p Price) Cost(u anthropic.Usage) NanoUSD {
	c := addCost(costOf(u.InputTokens, p.Input), costOf(u.OutputTokens, p.Output), costOf(u.CacheReadInputTokens, p.CacheRead))
	split := u.CacheCreation5m + u.CacheCreation1h
	if u.CacheCreation5m >= 0 && u.CacheCreation1h >= 0 && split > 0 && split <= u.CacheCreationInputTokens {
		return addCost(c, costOf(u.CacheCreation5m, p.CacheWrite5m), costOf(u.CacheCreation1h, p.CacheWrite1h),
			costOf(u.CacheCreationInputTokens-split, p.CacheWrite1h))
	}
	return addCost(c, costOf(u.CacheCreationInputTokens, p.CacheWrite1h))
}

// WorstCase is the most a call can cost: every input token at the dearest
// input-side rate (a 1-hour cache write) plus maxTokens of output.
func (p Price) WorstCase(inputTokens, maxTokens int64) NanoUSD {
	in := max(p.Input, p.CacheWrite5m, p.CacheWrite1h)
	return addCost(costOf(inputTokens, in), costOf(maxTokens, p.Output))
}
