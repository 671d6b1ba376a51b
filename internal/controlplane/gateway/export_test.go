package gateway

// QuoteSeeds are FuzzQuoteBody's seeds, which TestGatewayMessagesBodies
// also sends through a whole gateway.
var QuoteSeeds = quoteSeeds
