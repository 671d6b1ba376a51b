package budget

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talkide/talkide/internal/anthropic"
)

// BenchmarkBudgetReserveAndDebit measures one call's budget work (a durable
// reservation, then its settlement) per store, sequentially and with
// parallel callers (as many users). Sequentially each debit waits the
// writer's SettleDelay for company, as nothing else comes; in the gateway
// debits run in the background, so the parallel figure is the one that
// bounds throughput.
func BenchmarkBudgetReserveAndDebit(b *testing.B) {
	for _, store := range []string{"sqlite", "postgres"} {
		for _, parallel := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/parallel=%v", store, parallel), func(b *testing.B) {
				db := stores[store](b)
				s := NewService(db, Config{DefaultLimit: MaxCost / 2, FairUse: FairUse{Window: time.Minute, MaxRequests: 1 << 40}})
				defer s.Close()
				var n atomic.Int64
				one := func() {
					i := n.Add(1)
					res, err := s.PreCallCheck(b.Context(), Call{UserID: fmt.Sprintf("u%d", i%1000), Tenant: "t", Amount: 1000, EstimatedTokens: 10})
					if err != nil {
						b.Fatal(err)
					}
					if err := s.PostCallDebit(b.Context(), res, 500, Debit{Outcome: "complete", Usage: anthropic.Usage{InputTokens: 10, OutputTokens: 5}}); err != nil {
						b.Fatal(err)
					}
				}
				b.ResetTimer()
				if parallel {
					b.SetParallelism(8)
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							one()
						}
					})
				} else {
					for b.Loop() {
						one()
					}
				}
			})
		}
	}
}

// BenchmarkBudgetPreCallCheck measures the pre-call check alone (what a call
// waits for before it is forwarded), sequentially, for many users.
func BenchmarkBudgetPreCallCheck(b *testing.B) {
	for _, store := range []string{"sqlite", "postgres"} {
		b.Run(store, func(b *testing.B) {
			s := NewService(stores[store](b), Config{DefaultLimit: MaxCost / 2, FairUse: FairUse{Window: time.Minute, MaxRequests: 1 << 40}})
			defer s.Close()
			i := 0
			for b.Loop() {
				i++
				if _, err := s.PreCallCheck(b.Context(), Call{UserID: fmt.Sprintf("u%d", i%1000), Tenant: "t", Amount: 1000, EstimatedTokens: 10}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
