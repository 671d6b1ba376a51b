// A small line diff for showing the agent's file edits (Edit, MultiEdit,
// Write tool inputs). Lines are compared whole; the result lists every line
// of both sides in order, each marked "add", "del" or "same".

// Above this many cells the LCS table is not built: the edit is shown as
// all old lines removed and all new lines added, still correct, only less
// precise.
const MAX_CELLS = 4_000_000;

export function splitLines(s) {
  if (s === undefined || s === null || s === "") return [];
  const lines = String(s).split("\n");
  if (lines.length > 1 && lines[lines.length - 1] === "") lines.pop();
  return lines;
}

// lineDiff(a, b) compares two texts and returns [{kind, text}].
export function lineDiff(a, b) {
  const x = splitLines(a);
  const y = splitLines(b);
  // Common head and tail are cheap and keep the table small.
  let head = 0;
  while (head < x.length && head < y.length && x[head] === y[head]) head++;
  let tail = 0;
  while (tail < x.length - head && tail < y.length - head && x[x.length - 1 - tail] === y[y.length - 1 - tail]) tail++;
  const out = [];
  for (let i = 0; i < head; i++) out.push({ kind: "same", text: x[i] });
  const xs = x.slice(head, x.length - tail);
  const ys = y.slice(head, y.length - tail);
  const n = xs.length;
  const m = ys.length;
  if (n === 0 || m === 0 || (n + 1) * (m + 1) > MAX_CELLS) {
    for (const t of xs) out.push({ kind: "del", text: t });
    for (const t of ys) out.push({ kind: "add", text: t });
  } else {
    // lcs[i][j]: length of the longest common subsequence of xs[i:] and ys[j:].
    const w = m + 1;
    const lcs = new Uint32Array((n + 1) * w);
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lcs[i * w + j] = xs[i] === ys[j] ? lcs[(i + 1) * w + j + 1] + 1 : Math.max(lcs[(i + 1) * w + j], lcs[i * w + j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n && j < m) {
      if (xs[i] === ys[j]) {
        out.push({ kind: "same", text: xs[i] });
        i++;
        j++;
      } else if (lcs[(i + 1) * w + j] >= lcs[i * w + j + 1]) {
        out.push({ kind: "del", text: xs[i++] });
      } else {
        out.push({ kind: "add", text: ys[j++] });
      }
    }
    while (i < n) out.push({ kind: "del", text: xs[i++] });
    while (j < m) out.push({ kind: "add", text: ys[j++] });
  }
  for (let i = x.length - tail; i < x.length; i++) out.push({ kind: "same", text: x[i] });
  return out;
}

// contextOnly keeps the changed lines and `ctx` unchanged lines around
// each change; a run of hidden lines becomes {kind: "gap", count}.
export function contextOnly(lines, ctx = 3) {
  const keep = new Uint8Array(lines.length);
  lines.forEach((l, i) => {
    if (l.kind === "same") return;
    for (let k = Math.max(0, i - ctx); k <= Math.min(lines.length - 1, i + ctx); k++) keep[k] = 1;
  });
  const out = [];
  let hidden = 0;
  lines.forEach((l, i) => {
    if (keep[i]) {
      if (hidden) out.push({ kind: "gap", count: hidden });
      hidden = 0;
      out.push(l);
    } else hidden++;
  });
  if (hidden) out.push({ kind: "gap", count: hidden });
  return out;
}

// fileEdits returns the edits of an Edit, MultiEdit or Write tool input as
// [{path, lines}] (lines from lineDiff), or null for any other tool.
export function fileEdits(name, input) {
  if (!input || typeof input !== "object") return null;
  const path = typeof input.file_path === "string" ? input.file_path : typeof input.path === "string" ? input.path : "";
  const str = (v) => (typeof v === "string" ? v : "");
  switch (name) {
    case "Edit":
      return [{ path, lines: lineDiff(str(input.old_string), str(input.new_string)) }];
    case "MultiEdit":
      return (Array.isArray(input.edits) ? input.edits : []).map((e) => ({
        path,
        lines: lineDiff(str(e && e.old_string), str(e && e.new_string)),
      }));
    case "Write":
      return [{ path, lines: lineDiff("", str(input.content)) }];
    default:
      return null;
  }
}
