// Bundles the browser UI (src/main.jsx and the CSS it imports) into
// internal/controlplane/webui/dist, which the control plane embeds (go:embed):
//
//   dist/index.html               the page, referencing the files below
//   dist/assets/app-<hash>.js     one ES module, minified
//   dist/assets/app-<hash>.css    the CSS the app imports, minified
//   dist/assets/<name>-<hash>.*   files the app imports (images, fonts)
//
// The same sources give the same bytes (esbuild is deterministic and the
// page is written from sorted names only), so a rebuild changes nothing and
// the hashed names let the control plane cache assets forever. Everything
// in dist except the committed NOT-BUILT.txt is replaced on each run.
//
// Run from anywhere: node web/build.mjs (make web does, after npm ci).
import * as esbuild from "esbuild";
import { mkdir, readdir, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const webDir = path.dirname(fileURLToPath(import.meta.url));
const distDir = path.join(webDir, "..", "internal", "controlplane", "webui", "dist");
const keep = new Set(["NOT-BUILT.txt"]);

const started = performance.now();
const result = await esbuild.build({
  absWorkingDir: webDir,
  entryPoints: ["src/main.jsx"],
  outdir: distDir,
  entryNames: "assets/app-[hash]",
  assetNames: "assets/[name]-[hash]",
  bundle: true,
  format: "esm",
  // Browsers with JavaScript modules, as the issue asks; esbuild lowers
  // newer syntax to this.
  target: ["es2020", "chrome100", "firefox100", "safari15"],
  platform: "browser",
  jsx: "automatic",
  jsxImportSource: "preact",
  loader: { ".svg": "file", ".png": "file", ".woff2": "file" },
  define: { "process.env.NODE_ENV": '"production"' },
  minify: true,
  charset: "utf8",
  legalComments: "eof",
  sourcemap: false,
  metafile: true,
  write: false,
  logLevel: "warning",
});

// The entry's JS and its CSS bundle, as the page names them (relative, so
// the page works under a path prefix too).
const rel = (p) => path.relative(distDir, path.resolve(webDir, p)).split(path.sep).join("/");
let js, css;
for (const [out, meta] of Object.entries(result.metafile.outputs)) {
  if (meta.entryPoint === "src/main.jsx") {
    js = rel(out);
    if (meta.cssBundle) css = rel(meta.cssBundle);
  }
}
if (!js) throw new Error("build: esbuild produced no bundle for src/main.jsx");

const html = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="color-scheme" content="light dark">
<meta name="referrer" content="no-referrer">
<title>TalkIDE</title>
<link rel="icon" href="data:,">
${css ? `<link rel="stylesheet" href="${css}">\n` : ""}<script type="module" src="${js}"></script>
</head>
<body>
<noscript>TalkIDE needs JavaScript: turn it on for this site to use the app.</noscript>
<div id="app"></div>
</body>
</html>
`;

// Clean, then write: files of an older build (other hashes) go.
await mkdir(distDir, { recursive: true });
for (const name of await readdir(distDir)) {
  if (!keep.has(name)) await rm(path.join(distDir, name), { recursive: true, force: true });
}
const files = [...result.outputFiles].sort((a, b) => (a.path < b.path ? -1 : 1));
for (const f of files) {
  await mkdir(path.dirname(f.path), { recursive: true });
  await writeFile(f.path, f.contents);
}
await writeFile(path.join(distDir, "index.html"), html);

const kb = (n) => `${(n / 1024).toFixed(1)} KiB`;
const sizes = files.map((f) => `${rel(f.path)} (${kb(f.contents.length)})`).join(", ");
console.log(`bundled the browser UI into ${path.relative(process.cwd(), distDir) || "."}: index.html, ${sizes} in ${Math.round(performance.now() - started)} ms`);
