//go:build !localdev

// Package tagged links net/http/cookiejar unless built with the tag
// localdev: deptest's test that the images' build ignores GOFLAGS.
package tagged

import _ "net/http/cookiejar"
