package budget

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// NanoUSD is an amount of money in 10⁻⁹ US dollars. Money is never a float.
type NanoUSD = int64

// NanoPerUSD is one US dollar in NanoUSD.
const NanoPerUSD NanoUSD = 1_000_000_000

// MaxCost caps every computed amount (about 1.15 billion USD): far above any
// limit, far below int64 overflow even when several are added.
const MaxCost NanoUSD = math.MaxInt64 / 8

// ErrBadAmount is returned (wrapped) by ParseUSD for text that is not a
// non-negative decimal number of dollars with at most 9 decimals.
var ErrBadAmount = errors.New("bad amount")

// ParseUSD parses a non-negative decimal amount of US dollars ("12",
// "0.5", "0.000000001") exactly into NanoUSD. It accepts at most 9 decimals
// (one nano-USD) and amounts up to MaxCost; no sign, exponent or spaces.
// Errors wrap ErrBadAmount.
func ParseUSD(s string) (NanoUSD, error) {
	whole, frac, hasDot := strings.Cut(s, ".")
	if whole == "" || (hasDot && frac == "") || len(frac) > 9 || !digits(whole) || !digits(frac) {
		return 0, fmt.Errorf("%w: %q: want dollars like 12 or 0.25 (at most 9 decimals)", ErrBadAmount, s)
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w > MaxCost/NanoPerUSD {
		return 0, fmt.Errorf("%w: %q: too large", ErrBadAmount, s)
	}
	var f int64
	if frac != "" {
		f, _ = strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
	}
	return w*NanoPerUSD + f, nil
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// FormatUSD renders n as decimal dollars without trailing zeros ("12.5",
// "0.000000001", "-3"); the inverse of ParseUSD for non-negative amounts.
func FormatUSD(n NanoUSD) string {
	sign := ""
	u := uint64(n)
	if n < 0 {
		sign, u = "-", uint64(-n)
	}
	whole, frac := u/uint64(NanoPerUSD), u%uint64(NanoPerUSD)
	if frac == 0 {
		return sign + strconv.FormatUint(whole, 10)
	}
	fs := strings.TrimRight(fmt.Sprintf("%09d", frac), "0")
	return sign + strconv.FormatUint(whole, 10) + "." + fs
}
