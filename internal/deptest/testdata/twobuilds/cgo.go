//go:build cgo

// Package twobuilds links net/http/cookiejar only with cgo and
// net/http/httptrace only without: deptest's test of Builds.
package twobuilds

import _ "net/http/cookiejar"
