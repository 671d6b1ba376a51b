// Package pgdsn makes PostgreSQL connection strings safe to print: Redact
// masks every password in one, in each form pgx accepts (a postgres:// URL's
// userinfo, a password or sslpassword query parameter, a keyword/value
// string's password= or sslpassword=), and Scrub removes those passwords
// from any text, such as a driver's error message.
//
// It is not a parser for connecting (pgx parses for that) and it does not
// validate: on input it cannot take apart it prints nothing of the string.
package pgdsn

import (
	"errors"
	"net/url"
	"strings"
)

const mask = "xxxxx"

// IsURL reports whether s is a connection URL (postgres:// or
// postgresql://); anything else pgx reads as keyword/value pairs.
func IsURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// CheckURL refuses a postgres:// URL whose user information holds a raw
// '@': parsers disagree on where such a password ends (pgx splits at the
// first '@', net/url at the last), so part of the password would be taken
// for the host and end up in a DNS error. The error never repeats the URL.
func CheckURL(s string) error {
	rest := s[strings.Index(s, "://")+3:]
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	if strings.Count(rest, "@") > 1 {
		return errors.New("the database URL's user or password holds a raw '@': percent-encode it as %40 (and '/' as %2F, ':' as %3A)")
	}
	return nil
}

// secretKey reports whether a parameter named key holds a secret: password
// and sslpassword (the client key's passphrase), and, erring on the side of
// masking, any other key with "password" in its name.
func secretKey(key string) bool {
	return strings.Contains(strings.ToLower(key), "password")
}

// Redact returns dsn with every password replaced by xxxxx, for messages
// and logs. A string it cannot take apart comes back as a placeholder that
// shows none of it.
func Redact(dsn string) string {
	if IsURL(dsn) {
		return redactURL(dsn)
	}
	return redactKeywordValue(dsn)
}

func redactURL(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable postgres URL)"
	}
	if u.Opaque != "" || u.Fragment != "" {
		// Not a shape pgx gives meaning to: do not guess where a
		// password might sit.
		return "(unparsable postgres URL)"
	}
	if u.RawQuery != "" {
		pairs := strings.Split(u.RawQuery, "&")
		for i, pair := range pairs {
			rawKey, _, _ := strings.Cut(pair, "=")
			key, err := url.QueryUnescape(rawKey)
			if err != nil || secretKey(key) {
				pairs[i] = rawKey + "=" + mask
			}
		}
		u.RawQuery = strings.Join(pairs, "&")
	}
	return u.Redacted()
}

// kv is one keyword/value pair of a connection string: key, the value as
// pgx reads it, and where its raw text starts and ends in the string.
type kv struct {
	key, value string
	start, end int
}

// keywordValues takes s apart as libpq does (key = value, values either
// bare up to white space with backslash escapes, or single-quoted with
// backslash escapes), or reports false.
func keywordValues(s string) ([]kv, bool) {
	const space = " \t\n\r\v\f"
	var out []kv
	i := 0
	skip := func() {
		for i < len(s) && strings.IndexByte(space, s[i]) >= 0 {
			i++
		}
	}
	skip()
	for i < len(s) {
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			return nil, false
		}
		key := strings.Trim(s[i:i+eq], space)
		if key == "" || strings.ContainsAny(key, space) {
			return nil, false
		}
		i += eq + 1
		skip()
		var val strings.Builder
		start := i
		if i < len(s) && s[i] == '\'' {
			i++
			for ; i < len(s) && s[i] != '\''; i++ {
				if s[i] == '\\' {
					i++
					if i == len(s) {
						return nil, false
					}
				}
				val.WriteByte(s[i])
			}
			if i == len(s) {
				return nil, false
			}
			i++ // the closing quote
		} else {
			for ; i < len(s) && strings.IndexByte(space, s[i]) < 0; i++ {
				if s[i] == '\\' {
					i++
					if i == len(s) {
						break
					}
				}
				val.WriteByte(s[i])
			}
		}
		out = append(out, kv{key, val.String(), start, i})
		skip()
	}
	return out, true
}

func redactKeywordValue(dsn string) string {
	pairs, ok := keywordValues(dsn)
	if !ok {
		return "(unparsable postgres connection string)"
	}
	var b strings.Builder
	last := 0
	for _, p := range pairs {
		if !secretKey(p.key) {
			continue
		}
		b.WriteString(dsn[last:p.start])
		b.WriteString(mask)
		last = p.end
	}
	b.WriteString(dsn[last:])
	return b.String()
}

// secrets returns the passwords in dsn, raw and decoded, as they might
// appear in a message.
func secrets(dsn string) []string {
	var out []string
	add := func(ss ...string) {
		for _, s := range ss {
			if s != "" {
				out = append(out, s)
			}
		}
	}
	if !IsURL(dsn) {
		pairs, _ := keywordValues(dsn)
		for _, p := range pairs {
			if secretKey(p.key) {
				add(p.value, dsn[p.start:p.end])
			}
		}
		return out
	}
	rest := strings.TrimPrefix(strings.TrimPrefix(dsn, "postgresql://"), "postgres://")
	if i := strings.IndexAny(rest, "@/"); i >= 0 && rest[i] == '@' {
		if _, pw, ok := strings.Cut(rest[:i], ":"); ok {
			dec, _ := url.PathUnescape(pw)
			add(pw, dec)
		}
	}
	if _, query, ok := strings.Cut(dsn, "?"); ok {
		for pair := range strings.SplitSeq(query, "&") {
			rawKey, rawVal, _ := strings.Cut(pair, "=")
			key, _ := url.QueryUnescape(rawKey)
			if secretKey(key) || secretKey(rawKey) {
				dec, _ := url.QueryUnescape(rawVal)
				add(rawVal, dec)
			}
		}
	}
	return out
}

// Scrub returns text with every password of dsn in it replaced by xxxxx:
// for messages that quote the connection string in their own way (a
// driver's parse or connect error).
func Scrub(text, dsn string) string {
	for _, s := range secrets(dsn) {
		text = strings.ReplaceAll(text, s, mask)
	}
	return text
}

// ScrubError returns err with the passwords of dsn scrubbed from its
// message (Scrub); it unwraps to err, so errors.Is and errors.As still see
// the driver's error. Nil stays nil.
func ScrubError(err error, dsn string) error {
	if err == nil {
		return nil
	}
	return &scrubbedError{msg: Scrub(err.Error(), dsn), err: err}
}

type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }
