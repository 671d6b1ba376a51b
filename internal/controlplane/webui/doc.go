// Package webui serves the browser UI that the control plane embeds: the
// bundle that `make web` (web/build.mjs) writes into dist/, compiled into
// the binary with go:embed.
//
// Main entry: Handler, mounted by the control plane at GET / (index.html,
// never cached, so a new build reaches browsers at once; /?c=<id> and
// #token= links reach the same page) and GET /assets/ (content-hashed
// files, cached forever). Every answer carries a strict Content Security
// Policy (scripts and styles only from this origin, no inline code), nosniff
// and Referrer-Policy no-referrer, so a #token in the address never leaves
// the page. Built reports whether the binary holds a UI at all; without
// one, / answers 503 with a page saying to run `make web`.
//
// It is not the browser API (package controlplane) and holds no UI source:
// that lives in web/src, built by esbuild; nothing here runs Node.
package webui
