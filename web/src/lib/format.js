// Formatting of money, tokens, durations and times for people.

// usdFromNano formats billionths of a dollar: "$0.0012", "$1.23".
export function usdFromNano(nano) {
  const n = Number(nano) || 0;
  return usd(n / 1e9);
}

// usd formats dollars; small amounts keep four decimals so that a demo
// turn's cost is not shown as $0.00.
export function usd(v) {
  const n = Number(v);
  if (!Number.isFinite(n)) return "$–";
  const abs = Math.abs(n);
  const digits = abs === 0 ? 2 : abs < 0.01 ? 4 : abs < 1 ? 3 : 2;
  return (n < 0 ? "-$" : "$") + abs.toFixed(digits);
}

// usdString formats a decimal string from the API ("0.0123").
export function usdString(s) {
  if (s === undefined || s === null || s === "") return "$–";
  return usd(Number(s));
}

// usdExact formats an amount keeping up to four decimals ("$9.9977",
// "$10.00"), for a remaining budget that a few small turns have moved.
export function usdExact(s) {
  const n = Number(s);
  if (s === undefined || s === null || s === "" || !Number.isFinite(n)) return "$–";
  let t = Math.abs(n).toFixed(4).replace(/0{1,2}$/, "");
  return (n < 0 ? "-$" : "$") + t;
}

export function tokens(n) {
  const v = Number(n) || 0;
  if (v < 1000) return String(v);
  if (v < 10_000) return (v / 1000).toFixed(1) + "k";
  if (v < 1_000_000) return Math.round(v / 1000) + "k";
  return (v / 1e6).toFixed(1) + "M";
}

export function duration(ms) {
  const v = Number(ms) || 0;
  if (v < 1000) return v + " ms";
  if (v < 60_000) return (v / 1000).toFixed(v < 10_000 ? 1 : 0) + " s";
  const m = Math.floor(v / 60_000);
  const s = Math.round((v % 60_000) / 1000);
  return `${m} min ${s} s`;
}

// relTime says how long ago t was: "just now", "5 min", "3 h", "yesterday",
// or a date.
export function relTime(t, now = Date.now()) {
  const d = new Date(t);
  const ms = d.getTime();
  if (!Number.isFinite(ms) || ms <= 0) return "";
  const s = Math.round((now - ms) / 1000);
  if (s < 45) return "just now";
  if (s < 3600) return Math.max(1, Math.round(s / 60)) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  if (s < 172800) return "yesterday";
  if (s < 7 * 86400) return Math.round(s / 86400) + " days ago";
  return d.toLocaleDateString(undefined, { day: "numeric", month: "short", year: d.getFullYear() === new Date(now).getFullYear() ? undefined : "numeric" });
}

// oneLine shortens s to one line of at most n characters.
export function oneLine(s, n = 80) {
  const t = String(s ?? "").replace(/\s+/g, " ").trim();
  return t.length > n ? t.slice(0, n - 1) + "…" : t;
}

// Text-direction controls and zero-width characters show as a visible
// marker (⟨U+202E⟩), so the agent's text cannot read other than it is: a
// right-to-left override would make "gnp.exe" read "exe.png".
const INVISIBLE = /[\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;
// ANSI escape sequences (colours, cursor moves) of terminal output.
const ANSI = /\u001b(?:\[[0-9;?]*[ -/]*[@-~]|\][^\u0007\u001b]*(?:\u0007|\u001b\\)|[@-Z\\-_])/g;

// visible(s) is s as this page shows the agent's text: ANSI escapes
// removed, invisible and direction-changing characters made visible.
export function visible(s) {
  return String(s ?? "")
    .replace(ANSI, "")
    .replace(INVISIBLE, (c) => "⟨U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + "⟩");
}
