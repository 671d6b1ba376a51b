package webui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/talkide/talkide/internal/contract"
	"github.com/talkide/talkide/internal/httpapi"
)

// dist is what web/build.mjs wrote (all: keeps names starting with . or _).
// A fresh clone holds only dist/NOT-BUILT.txt.
//
//go:embed all:dist
var dist embed.FS

// CSP is the Content Security Policy of every answer: code, styles and
// connections only from this origin, nothing inline, no framing. Images may
// also be data: URLs (the page's empty icon, inline SVG in CSS).
const CSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// AssetsPrefix is where the hashed files are served; web/build.mjs writes
// them under dist/assets/.
const AssetsPrefix = "/assets/"

// assetCache lets browsers keep a hashed file for a year without asking
// again: a new build gives new names.
const assetCache = "public, max-age=31536000, immutable"

// contentTypes of the files esbuild writes (web/build.mjs loaders); fixed
// here, not read from the host's /etc/mime.types, so every host serves the
// same types.
var contentTypes = map[string]string{
	".js":    "text/javascript; charset=utf-8",
	".css":   "text/css; charset=utf-8",
	".svg":   "image/svg+xml",
	".png":   "image/png",
	".woff2": "font/woff2",
	".json":  "application/json",
	".txt":   "text/plain; charset=utf-8",
}

// notBuilt is the page / answers (503) when the binary holds no UI.
const notBuilt = `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>TalkIDE: UI not built</title></head>
<body>
<h1>The browser UI was not built</h1>
<p>This control plane was compiled without the browser UI. Run <code>make web</code>
(or <code>make build</code> / <code>make run</code>, which run it first), then start it again.</p>
<p>The browser API under <code>/api/</code> works without it.</p>
</body>
</html>
`

// Built reports whether the binary holds a built UI (dist/index.html).
func Built() bool {
	_, err := fs.Stat(dist, "dist/index.html")
	return err == nil
}

// Handler serves the embedded UI: GET / and GET /assets/... (mount it on
// both). It logs once, here, when the UI was not built.
func Handler(log *slog.Logger) http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // "dist" is a valid path: cannot happen
	}
	return newHandler(sub, log)
}

// asset is one file under assets/, held in memory (the bundle is small).
type asset struct {
	body        []byte
	contentType string
}

type handler struct {
	log *slog.Logger
	// index is dist/index.html, nil when the UI was not built; indexTag
	// its ETag.
	index    []byte
	indexTag string
	// assets by name below assets/ (e.g. "app-3NIE5QNM.js"); read-only.
	assets map[string]asset
}

func newHandler(fsys fs.FS, log *slog.Logger) *handler {
	h := &handler{log: log, assets: map[string]asset{}}
	if b, err := fs.ReadFile(fsys, "index.html"); err == nil {
		sum := sha256.Sum256(b)
		h.index, h.indexTag = b, `"`+hex.EncodeToString(sum[:16])+`"`
	} else {
		log.Warn("browser UI not built: / answers 503 until the control plane is built after `make web`", "err", err)
	}
	// Only regular files directly or deeper under assets/ are served,
	// looked up by exact name: no listing, no path the map does not hold.
	_ = fs.WalkDir(fsys, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			log.Error("read embedded UI asset", "path", p, "err", err)
			return nil
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			ct = "application/octet-stream"
		}
		h.assets[strings.TrimPrefix(p, "assets/")] = asset{body: b, contentType: ct}
		return nil
	})
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", CSP)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hd.Set("Allow", "GET, HEAD")
		httpapi.WriteError(h.log, w, r, httpapi.Errorf(http.StatusMethodNotAllowed, contract.ErrTypeMethod, "method %s not allowed on %s", r.Method, r.URL.Path))
		return
	}
	if name, ok := strings.CutPrefix(r.URL.Path, AssetsPrefix); ok {
		a, found := h.assets[name]
		if !found {
			httpapi.WriteError(h.log, w, r, httpapi.NotFound("no such UI asset: %s", r.URL.Path))
			return
		}
		hd.Set("Content-Type", a.contentType)
		hd.Set("Cache-Control", assetCache)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
		return
	}
	if r.URL.Path != "/" {
		httpapi.WriteError(h.log, w, r, httpapi.NotFound("no such page: %s", r.URL.Path))
		return
	}
	hd.Set("Cache-Control", "no-cache")
	hd.Set("Content-Type", "text/html; charset=utf-8")
	if h.index == nil {
		hd.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(notBuilt))
		return
	}
	// no-cache: the browser asks each time, and gets 304 while the build
	// (the ETag) is unchanged.
	hd.Set("ETag", h.indexTag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(h.index))
}
