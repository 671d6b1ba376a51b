package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
	"github.com/talkide/talkide/internal/controlplane/budget"
)

// quote is what a messages call's body is worth before it is forwarded:
// the members the gateway reads (head), the price of its model, its
// server tools' bound, its prompt estimate and the two amounts reserved
// from them.
type quote struct {
	head  anthropic.RequestHead
	price budget.Price
	tools budget.ToolBound
	// prompt is the prompt's tokens over-estimated: no tokenizer yields
	// fewer than one token per 3 bytes of JSON.
	prompt int64
	// amount is the call's worst case (its whole max_tokens of output),
	// reserved by preCallCheck; floor is the input alone, booked for a
	// call whose usage never came.
	amount, floor budget.NanoUSD
}

// quoteBody reads and prices body, a /v1/messages request, with prices as
// they stand at at. A body it cannot price is a refusal: malformed or
// ambiguous members (400 bad_request), max_tokens outside 1-MaxOutputTokens
// (400), a model or server tool without a price when prices deny unknown
// ones (400 unknown_model, unknown_tool). It reads nothing but body: the
// fuzz target FuzzQuoteBody runs it directly.
func quoteBody(prices *budget.PriceTable, body []byte, at time.Time) (quote, *refusal) {
	head, err := anthropic.ScanRequestHead(body)
	if err != nil {
		return quote{}, refused("bad_request", http.StatusBadRequest, anthropic.ErrInvalidRequest, "request body: "+strings.TrimPrefix(err.Error(), anthropic.ErrMalformedRequest.Error()+": "))
	}
	if head.MaxTokens < 1 || head.MaxTokens > MaxOutputTokens {
		return quote{}, refused("bad_request", http.StatusBadRequest, anthropic.ErrInvalidRequest, fmt.Sprintf("max_tokens must be between 1 and %d", MaxOutputTokens))
	}
	price, known := prices.PriceFor(head.Model, at)
	if !known && prices.Unknown == budget.UnknownDeny {
		return quote{}, refused("unknown_model", http.StatusBadRequest, anthropic.ErrInvalidRequest,
			fmt.Sprintf("model %q has no price in this TalkIDE gateway, so it cannot be budgeted; use a listed model or ask your administrator to add it", head.Model))
	}
	var tools budget.ToolBound
	if len(head.ServerTools) > 0 || head.MCPServers > 0 {
		var toolsKnown bool
		tools, toolsKnown = prices.ServerTools(head.ServerTools, head.MCPServers)
		if !toolsKnown && prices.Unknown == budget.UnknownDeny {
			return quote{}, refused("unknown_tool", http.StatusBadRequest, anthropic.ErrInvalidRequest,
				"a server tool of this request has no price in this TalkIDE gateway, so it cannot be budgeted; ask your administrator to add it")
		}
	}
	prompt := int64(len(body))/3 + 1
	return quote{
		head: head, price: price, tools: tools, prompt: prompt,
		amount: price.WorstCaseWithTools(prompt, head.MaxTokens, tools),
		floor:  price.WorstCaseWithTools(prompt, 0, tools),
	}, nil
}
