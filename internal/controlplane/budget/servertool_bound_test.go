package budget

import (
	"strings"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
)

// TestWorstCaseWithToolsCoversTheMostACallCanBill: for every model of the
// built-in table (Haiku 5.5's prompt tiers included) and every kind of
// server tool, a call that makes every use, adds the most result tokens
// with each, writes its whole last context to the cache at the 1-hour rate,
// reads it back in each later sampling and runs in the dearest geo costs no
// more than its worst case; and the worst case grows with max_tokens (the
// gateway's lowering searches it). A web search's fee is charged once.
func TestWorstCaseWithToolsCoversTheMostACallCanBill(t *testing.T) {
	p := DefaultPrices()
	toolSets := map[string][]anthropic.ServerTool{
		"web search, max_uses 5":      {{Type: "web_search_20250305", MaxUses: 5}},
		"web search, no max_uses":     {{Type: "web_search_20250305"}},
		"web fetch, 20 000 a use":     {{Type: "web_fetch_20250910", MaxUses: 2, MaxContentTokens: 20_000}},
		"code execution":              {{Type: "code_execution_20250825"}},
		"unknown tool and web search": {{Type: "future_tool_20270101"}, {Type: "web_search_20250305", MaxUses: 3}},
	}
	for _, pattern := range p.Models() {
		m := strings.TrimSuffix(pattern, "*") + "-20270101"
		price, _ := p.PriceFor(m, time.Now())
		for name, tools := range toolSets {
			tb, _ := p.ServerTools(tools, 0)
			for _, prompt := range []int64{70, 30_000, 200_000} {
				const maxTokens = 4096
				w := price.WorstCaseWithTools(prompt, maxTokens, tb)
				last := prompt + tb.ResultTokens + maxTokens
				for _, u := range []anthropic.Usage{
					{Model: m, CacheCreationInputTokens: last, CacheCreation1h: last, CacheReadInputTokens: tb.Uses * last,
						OutputTokens: maxTokens, WebSearchRequests: tb.WebSearches, InferenceGeo: "us"},
					{Model: m, InputTokens: last, OutputTokens: maxTokens, WebSearchRequests: tb.WebSearches, InferenceGeo: "us"},
				} {
					if c := price.Cost(u); c > w {
						t.Errorf("%s, %s, prompt %d: usage %+v costs %s USD, over the worst case %s USD", m, name, prompt, u, FormatUSD(c), FormatUSD(w))
					}
				}
				if w2 := price.WorstCaseWithTools(prompt, maxTokens+1, tb); w2 < w {
					t.Errorf("%s, %s: the worst case shrinks with max_tokens: %d then %d", m, name, w, w2)
				}
			}
		}
	}
	search, _ := p.ServerTools([]anthropic.ServerTool{{Type: "web_search_20250305", MaxUses: 5}}, 0)
	if search.Fees != 0 || search.WebSearchFee != 10_000_000 || search.WebSearches != 5 || search.ResultTokens != 100_000 {
		t.Errorf("web search, max_uses 5: got %+v, want 5 searches of 0.01 USD (their fee apart from Fees) adding 100 000 tokens", search)
	}
}
