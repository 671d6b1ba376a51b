//go:build !cgo

package twobuilds

import _ "net/http/httptrace"
