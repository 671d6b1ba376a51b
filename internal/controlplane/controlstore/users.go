package controlstore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/talkide/talkide/internal/kubename"
)

// MaxUserIDBytes bounds a user id.
const MaxUserIDBytes = 128

// ValidUserID reports whether id can name a user: 1-128 bytes of UTF-8 with
// no control characters and no leading or trailing white space.
func ValidUserID(id string) bool {
	if id == "" || len(id) > MaxUserIDBytes || !utf8.ValidString(id) || strings.TrimSpace(id) != id {
		return false
	}
	return !strings.ContainsFunc(id, unicode.IsControl)
}

// HashUserToken returns the stored form of a user's bearer token: the hex
// SHA-256 (users.token_hash).
func HashUserToken(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return hex.EncodeToString(sum[:])
}

// ParseTenantEnvs parses grants written "tenant/env,tenant/env"; each name
// is a DNS label (kubename.ValidName), since a worker's namespace is
// "{tenant}-{env}".
func ParseTenantEnvs(s string) ([][2]string, error) {
	var out [][2]string
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		t, e, ok := strings.Cut(part, "/")
		if !ok || !kubename.ValidName(t) || !kubename.ValidName(e) {
			return nil, fmt.Errorf("parse %q: want tenant/env of [a-z0-9-]", part)
		}
		out = append(out, [2]string{t, e})
	}
	return out, nil
}
