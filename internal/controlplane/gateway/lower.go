package gateway

import (
	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/budget"
)

// A budget smaller than one worst case.
//
// A call's worst case counts its whole max_tokens of output: with 64000
// tokens on an Opus-class model that alone is over 1.5 USD, so a user with
// less than that left would be refused every call, even one that would
// cost a cent. Instead, a call refused for its budget is admitted with
// max_tokens lowered to the most the remaining budget covers (the limit
// minus what is spent and held at the moment of the refusal), when that is
// at least MinLoweredMaxTokens (and above thinking.budget_tokens, which the
// upstream requires). The lowered call is reserved like any other, at its
// own (smaller) worst case, atomically with the limit check: admitted
// spend still never passes the limit. The forwarded body differs from the
// client's only in the max_tokens value, and the answer says so in
// HeaderMaxTokensLowered; the model stops with stop_reason "max_tokens"
// where the budget ends.

// MinLoweredMaxTokens is the smallest max_tokens the gateway lowers a call
// to; a call the remaining budget cannot cover with that many output
// tokens is refused.
const MinLoweredMaxTokens = 1024

// HeaderMaxTokensLowered is the response header of a call forwarded with
// max_tokens lowered to fit the user's budget; its value is the max_tokens
// forwarded (decimal tokens).
const HeaderMaxTokensLowered = "X-Talkide-Max-Tokens-Lowered"

// lowerMaxTokens returns the largest max_tokens below head.MaxTokens whose
// worst case fits the budget deny found left, if it is at least the
// minimum (MinLoweredMaxTokens, and more than the thinking budget).
func lowerMaxTokens(price budget.Price, prompt int64, head anthropic.RequestHead, tools budget.ToolBound, deny *budget.DenyError) (int64, bool) {
	left := deny.Limit - deny.Committed
	lo := max(int64(MinLoweredMaxTokens), head.ThinkingBudget+1)
	if left <= 0 || head.MaxTokens <= lo || price.WorstCaseWithTools(prompt, lo, tools) > left {
		return 0, false
	}
	// The worst case grows with max_tokens: the largest n in [lo, hi)
	// that fits.
	hi := head.MaxTokens
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if price.WorstCaseWithTools(prompt, mid, tools) <= left {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, true
}
