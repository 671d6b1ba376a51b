import { useState } from "preact/hooks";
import { contextOnly } from "../lib/diff.js";
import { visible } from "../lib/format.js";

// Diff shows one file edit: the changed lines with three lines of context,
// "+" for added and "−" for removed lines (also said in words to screen
// readers).
export function Diff({ path, title, lines, label }) {
  const [all, setAll] = useState(false);
  const shown = all ? lines : contextOnly(lines, 3);
  const added = lines.filter((l) => l.kind === "add").length;
  const removed = lines.filter((l) => l.kind === "del").length;
  const hidden = shown.some((l) => l.kind === "gap");
  return (
    <figure class="diff" data-testid="diff">
      <figcaption class="diff-head">
        <span class="diff-path" title={title || undefined}>
          {path || "(file)"}
        </span>
        {label && <span class="muted small">{label}</span>}
        <span class="diff-stat">
          <span class="add-n">+{added}</span> <span class="del-n">−{removed}</span>
        </span>
      </figcaption>
      <div class="diff-body">
        {shown.map((l) =>
          l.kind === "gap" ? (
            <div class="dl gap">
              <span>
                ⋯ {l.count} unchanged line{l.count === 1 ? "" : "s"}
              </span>
            </div>
          ) : (
            <div class={"dl " + l.kind} data-kind={l.kind === "add" ? "added" : l.kind === "del" ? "removed" : "unchanged"}>
              <span class="sign">
                <span aria-hidden="true">{l.kind === "add" ? "+" : l.kind === "del" ? "−" : " "}</span>
                <span class="sr-only">{l.kind === "add" ? "added" : l.kind === "del" ? "removed" : ""}</span>
              </span>
              <span class="txt">
                {visible(l.text) || " "}
              </span>
            </div>
          ),
        )}
      </div>
      {hidden && (
        <button type="button" class="ghost small" onClick={() => setAll(true)}>
          Show the whole edit
        </button>
      )}
    </figure>
  );
}
