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
// model as input, after which the model is sampled again over the whole
// prompt. So a call with server tools may bill far more input than its
// request body holds. The worst case of such a call assumes, for U uses
// in all whose results add R input tokens in all, that every one of the
// U+1 samplings reads the prompt and every result so far:
//
//	input tokens ≤ (U+1)·prompt + U·R
//
// priced at the dearest input-side rate of the tier that prompt+R falls in,
// plus the fees of U uses. A tool's uses are its max_uses, or
// DefaultServerToolUses without one (the API's own limit of server-tool
// iterations per call); a use's result is the table's
// input_tokens_per_use for the tool (a web fetch's max_content_tokens when
// the request sets it). A tool type the table does not list is priced as
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
	// are web searches (charged at the model's web search price too).
	Uses, WebSearches int64
	// ResultTokens is the input all those uses' results add at most.
	ResultTokens int64
	// Fees are the per-use fees of all uses but web searches', in nano-USD.
	Fees NanoUSD
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
		b.ResultTokens = min(b.ResultTokens+uses*resultTokens, maxToolTokens)
		if strings.HasPrefix(typ, "web_search") {
			b.WebSearches = min(b.WebSearches+uses, maxToolUses)
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
// (see "Server tools in the worst case"): every one of the tb.Uses+1
// samplings reads the prompt and all results, at the dearest input-side rate
// of the tier promptTokens+tb.ResultTokens falls in, plus maxTokens of
// output and the tools' fees, at the dearest geo.
func (p Price) WorstCaseWithTools(promptTokens, maxTokens int64, tb ToolBound) NanoUSD {
	if tb.Uses <= 0 {
		return p.WorstCase(promptTokens, maxTokens)
	}
	r := p.rates(promptTokens + tb.ResultTokens)
	in := max(r.Input, r.CacheWrite5m, r.CacheWrite1h, r.CacheRead)
	input := mulTokens(tb.Uses+1, promptTokens)
	input = min(input+mulTokens(tb.Uses, tb.ResultTokens), 1<<62)
	search := max(p.WebSearch, 0)
	cost := addCost(costOf(input, in), costOf(maxTokens, r.Output), costOf(tb.WebSearches*1_000_000, search), tb.Fees)
	return scale(cost, p.dearestGeo())
}

func (p Price) dearestGeo() int64 {
	var d int64
	for _, f := range p.geo {
		d = max(d, f)
	}
	return d
}
