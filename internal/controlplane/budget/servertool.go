package budget

import (
	"fmt"
	"strings"

	"github.com/talkide/talkide/internal/anthropic"
)

// Server tools in the worst case.
//
// A server tool (web search, web fetch, code execution, an MCP toolset:
// anthropic.IsClientTool says which are not) runs at the upstream inside
// one call: each use may cost a fee, and its result is fed back to the
// model as input, after which the model is sampled again. So a call with
// server tools may bill more input than its request body holds. What the
// upstream bills for that (Anthropic's pricing: web search is 10 USD per
// 1000 searches "plus standard token costs for search-generated content";
// the results "are counted as input tokens"; its example usage of one
// search reads back the context of the first sampling as
// cache_read_input_tokens) bounds a call with U uses in all, whose
// results add R input tokens in all (each use's at most the table's
// input_tokens_per_use for its tool, or a web fetch's max_content_tokens):
//
//   - the context of the last sampling, C = prompt + R + max_tokens (the
//     output so far is part of what later samplings read), is billed once
//     at the dearest input-side rate (at most a 1-hour cache write);
//   - each of the U samplings after the first reads back at most C from the
//     prompt cache, at the cache-read rate: U·C;
//   - max_tokens of output, and each use's fee;
//
// at the tier of C + U·C input tokens (Price.Cost chooses the tier by all
// input, cache reads included) and the dearest geo. Nothing is multiplied
// at the full input rate: a call with web search (max_uses 5, 20 000 tokens
// a use) and a small prompt reserves about 0.91 USD on Sonnet 4.5, where
// the quadratic bound this replaced ((U+1)·prompt + U·R at the dearest
// input rate) reserved 3.43 USD, 30 times a typical bill of 0.11 USD.
//
// A tool's uses are its max_uses, or DefaultServerToolUses without one
// (the API's own limit of server-tool iterations per call). A web search's
// fee is the larger of the table's per_use_usd and the model's web search
// price (never both). A tool type the table does not list is priced as
// the dearest listed one (or refused, under the unknown-model deny policy).

// DefaultServerToolUses is how many uses a server tool without max_uses is
// reserved for: the API pauses a call (stop_reason "pause_turn") after 10
// server-tool iterations.
const DefaultServerToolUses = 10

// maxToolUses and maxToolTokens clamp what a request may declare, so no sum
// or product of the bound overflows; far above anything a limit admits.
const (
	maxToolUses   = 1 << 20
	maxToolTokens = 1 << 40
)

// ServerToolPrice is what one use of a server tool may cost at most.
type ServerToolPrice struct {
	// PerUse is the fee of one use in nano-USD (web search: the larger of
	// this and the model's web search price).
	PerUse NanoUSD
	// InputTokensPerUse is the most input tokens one use's result adds.
	InputTokensPerUse int64
}

// fallbackServerTool prices server tools in a table that lists none (a
// price file written before server_tools existed): 5 cents and 100 000
// input tokens per use.
var fallbackServerTool = ServerToolPrice{PerUse: 50_000_000, InputTokensPerUse: 100_000}

type serverToolEntry struct {
	pattern string // without the '*'
	prefix  bool
	price   ServerToolPrice
}

type serverToolJSON struct {
	// Type is a tool type ("web_search_20250305") or a prefix ending in '*'.
	Type              string `json:"type"`
	PerUseUSD         string `json:"per_use_usd"`
	InputTokensPerUse int64  `json:"input_tokens_per_use"`
}

func (j serverToolJSON) entry() (serverToolEntry, error) {
	e := serverToolEntry{}
	e.pattern, e.prefix = strings.CutSuffix(j.Type, "*")
	if e.pattern == "" && !e.prefix || strings.Contains(e.pattern, "*") {
		return e, fmt.Errorf("type: want a tool type or a prefix ending in '*'")
	}
	if anthropic.IsClientTool(e.pattern) && !e.prefix {
		return e, fmt.Errorf("type %q runs on the client, not the upstream", j.Type)
	}
	fee, err := ParseUSD(j.PerUseUSD)
	if err != nil {
		return e, fmt.Errorf("per_use_usd: %v", err)
	}
	if j.InputTokensPerUse < 0 || j.InputTokensPerUse > maxToolTokens {
		return e, fmt.Errorf("input_tokens_per_use: want 0 to %d", int64(maxToolTokens))
	}
	e.price = ServerToolPrice{PerUse: fee, InputTokensPerUse: j.InputTokensPerUse}
	return e, nil
}

// ToolBound is the most a call's server tools may add to it (see "Server
// tools in the worst case").
type ToolBound struct {
	// Uses is the number of server-tool uses at most; WebSearches of them
	// are web searches.
	Uses, WebSearches int64
	// ResultTokens is the input all those uses' results add at most, in
	// tokens.
	ResultTokens int64
	// Fees are the per-use fees of all uses but web searches', in nano-USD.
	Fees NanoUSD
	// WebSearchFee is the table's fee of one web search, in nano-USD; a
	// web search costs the larger of it and the model's web search price.
	WebSearchFee NanoUSD
}

// ServerTool returns the price of one use of a server tool of type typ, and
// whether the table lists it (else: the dearest listed, see ServerTools).
func (t *PriceTable) ServerTool(typ string) (ServerToolPrice, bool) {
	best, bestRank := -1, -1
	for i, e := range t.tools {
		if e.prefix && !strings.HasPrefix(typ, e.pattern) || !e.prefix && typ != e.pattern {
			continue
		}
		r := len(e.pattern)
		if !e.prefix {
			r = 1 << 30
		}
		if r > bestRank {
			best, bestRank = i, r
		}
	}
	if best < 0 {
		return t.dearestTool, false
	}
	return t.tools[best].price, true
}

// ServerTools bounds what the server tools of a request (its tools, and
// mcpServers entries of mcp_servers, each an MCP toolset) may add to a
// call. known is false when a tool's type is not in the table; it is then
// priced as the dearest listed tool.
func (t *PriceTable) ServerTools(tools []anthropic.ServerTool, mcpServers int) (b ToolBound, known bool) {
	known = true
	add := func(typ string, uses, resultTokens int64) {
		p, ok := t.ServerTool(typ)
		known = known && ok
		if uses <= 0 {
			uses = DefaultServerToolUses
		}
		uses = min(uses, maxToolUses)
		if resultTokens <= 0 {
			resultTokens = p.InputTokensPerUse
		}
		resultTokens = min(resultTokens, maxToolTokens)
		b.Uses = min(b.Uses+uses, maxToolUses)
		b.ResultTokens = min(b.ResultTokens+mulTokens(uses, resultTokens), maxToolTokens)
		if strings.HasPrefix(typ, "web_search") {
			// Its fee is charged once, by WorstCaseWithTools: the larger
			// of this and the model's web search price.
			b.WebSearches = min(b.WebSearches+uses, maxToolUses)
			b.WebSearchFee = max(b.WebSearchFee, p.PerUse)
			return
		}
		b.Fees = addCost(b.Fees, costOf(uses*1_000_000, p.PerUse))
	}
	for _, tool := range tools {
		add(tool.Type, tool.MaxUses, tool.MaxContentTokens)
	}
	for range mcpServers {
		add("mcp_toolset", 0, 0)
	}
	return b, known
}

// dearestToolOf is the fail-closed server-tool price: the highest fee and
// result size of any entry, or fallbackServerTool for a table without any.
func dearestToolOf(es []serverToolEntry) ServerToolPrice {
	if len(es) == 0 {
		return fallbackServerTool
	}
	var d ServerToolPrice
	for _, e := range es {
		d.PerUse = max(d.PerUse, e.price.PerUse)
		d.InputTokensPerUse = max(d.InputTokensPerUse, e.price.InputTokensPerUse)
	}
	return d
}

// mulTokens multiplies token counts, saturating at maxToolTokens² (still
// far from overflow, and priced at MaxCost by costOf).
func mulTokens(a, b int64) int64 {
	const limit = 1 << 62
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > limit/b {
		return limit
	}
	return a * b
}

// WorstCaseWithTools is WorstCase for a call whose server tools may add tb
// (see "Server tools in the worst case"), in nano-USD: the context of the
// last sampling, C = promptTokens + tb.ResultTokens + maxTokens, at the
// dearest input-side rate, C read back from the cache by each of the
// tb.Uses samplings after the first, maxTokens of output and the tools'
// fees, at the tier of C + tb.Uses·C input tokens and the dearest geo.
// Without server tools (tb.Uses 0) it is WorstCase. It saturates at
// MaxCost.
func (p Price) WorstCaseWithTools(promptTokens, maxTokens int64, tb ToolBound) NanoUSD {
	if tb.Uses <= 0 {
		return p.WorstCase(promptTokens, maxTokens)
	}
	const limit = 1 << 62
	last := min(max(promptTokens, 0)+max(tb.ResultTokens, 0)+max(maxTokens, 0), limit) // the last sampling's context
	reads := mulTokens(tb.Uses, last)
	r := p.rates(min(last+reads, limit))
	in := max(r.Input, r.CacheWrite5m, r.CacheWrite1h, r.CacheRead)
	search := max(p.WebSearch, tb.WebSearchFee, 0)
	cost := addCost(costOf(last, in), costOf(reads, r.CacheRead), costOf(maxTokens, r.Output),
		costOf(tb.WebSearches*1_000_000, search), tb.Fees)
	return scale(cost, p.dearestGeo())
}

func (p Price) dearestGeo() int64 {
	var d int64
	for _, f := range p.geo {
		d = max(d, f)
	}
	return d
}
