import { useState } from "preact/hooks";
import { fileEdits } from "../../lib/diff.js";
import { oneLine, visible } from "../../lib/format.js";
import { pretty, relPath, shortInput, toolName } from "../../lib/tools.js";
import { Diff } from "../Diff.jsx";
import { Markdown } from "../Markdown.jsx";
import { ItemView } from "./ItemView.jsx";

// Output longer than this is cut, with a button to show it all.
const OUTPUT_LINES = 200;
const OUTPUT_CHARS = 20000;

function Output({ text: raw, isError, id }) {
  const [all, setAll] = useState(false);
  const text = visible(raw);
  const lines = text.split("\n");
  const long = lines.length > OUTPUT_LINES || text.length > OUTPUT_CHARS;
  const shown = all || !long ? text : lines.slice(0, OUTPUT_LINES).join("\n").slice(0, OUTPUT_CHARS);
  return (
    <div class={"tool-out" + (isError ? " err" : "")} data-event-id={id}>
      <div class="section-label">{isError ? "Error" : "Output"}</div>
      {text === "" ? (
        <p class="muted small">(no output)</p>
      ) : (
        <pre class="code">
          <code>{shown}</code>
        </pre>
      )}
      {long && !all && (
        <button type="button" class="ghost small" onClick={() => setAll(true)}>
          Show all {lines.length} lines
        </button>
      )}
    </div>
  );
}

function ToolInput({ name, input, dir }) {
  const edits = fileEdits(name, input);
  if (edits) {
    return (
      <div class="tool-in">
        {edits.map((e, i) => (
          <Diff path={relPath(e.path, dir)} title={e.path} lines={e.lines} label={edits.length > 1 ? `edit ${i + 1} of ${edits.length}` : name === "Write" ? "new content" : ""} />
        ))}
      </div>
    );
  }
  if (name === "Bash" && input && typeof input.command === "string") {
    return (
      <div class="tool-in">
        {input.description && <p class="muted small">{input.description}</p>}
        <pre class="code">
          <code>
            <span class="prompt" aria-hidden="true">
              ${" "}
            </span>
            {visible(input.command)}
          </code>
        </pre>
      </div>
    );
  }
  if ((name === "Agent" || name === "Task") && input && typeof input.prompt === "string") {
    return (
      <div class="tool-in">
        <div class="section-label">Task for the subagent{input.subagent_type ? ` (${input.subagent_type})` : ""}</div>
        <div class="quote">
          <Markdown text={input.prompt} />
        </div>
      </div>
    );
  }
  return (
    <div class="tool-in">
      <div class="section-label">Input</div>
      <pre class="code">
        <code>{visible(pretty(input))}</code>
      </pre>
    </div>
  );
}

// ToolCall is one tool call: its summary line, its input, a subagent's
// own calls nested, and its output.
export function ToolCall({ item, ctx }) {
  const { tool, server } = toolName(item.name);
  const edits = ["Edit", "MultiEdit", "Write"].includes(item.name);
  const agent = item.name === "Agent" || item.name === "Task";
  const status = item.result
    ? item.result.interrupted
      ? "stopped"
      : item.result.isError
        ? "error"
        : "done"
    : item.stopped
      ? "stopped"
      : "running";
  const statusText = { error: "failed", done: "done", stopped: "stopped", running: "running" }[status];
  const dir = ctx && ctx.workDir;
  const arg = oneLine(shortInput(item.name, item.input, dir), 90);
  return (
    <details class={"tool " + status + (item.parent ? " nested" : "")} data-testid="tool-call" data-event-id={item.id} data-tool={item.name} open={edits || agent}>
      <summary>
        <span class={"dot " + status} aria-hidden="true" />
        <span class="tool-name">{tool}</span>
        {server && <span class="tool-server">{server}</span>}
        {arg && <span class="tool-arg">{arg}</span>}
        <span class="tool-status">{statusText}</span>
      </summary>
      <div class="tool-body">
        <ToolInput name={item.name} input={item.input} dir={dir} />
        {item.children.length > 0 && (
          <div class="subcalls" aria-label="Subagent tool calls" role="group">
            {item.children.map((c) => (
              <ItemView key={c.toolUseId} item={c} v={c.v} ctx={ctx} />
            ))}
          </div>
        )}
        {item.result ? (
          <Output text={String(item.result.content)} isError={item.result.isError} id={item.result.id} />
        ) : (
          <p class="muted small">{status === "stopped" ? "No result: the turn ended first." : "Running…"}</p>
        )}
      </div>
    </details>
  );
}
