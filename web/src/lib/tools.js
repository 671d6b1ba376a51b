// What the timeline shows of a tool call's name and input, without a
// browser (web/e2e/ui-logic.test.mjs).

// toolName splits an MCP tool's name ("mcp__server__tool").
export function toolName(name) {
  const m = /^mcp__(.+?)__(.+)$/.exec(name || "");
  return m ? { tool: m[2], server: m[1] } : { tool: name || "tool", server: "" };
}

// relPath shows a path inside the agent's working directory relative to it.
export function relPath(p, dir) {
  if (typeof p !== "string" || !dir) return p;
  const d = dir.replace(/\/+$/, "") + "/";
  return p.startsWith(d) ? p.slice(d.length) || "." : p;
}

// shortInput is the one line a tool call's summary shows of its input.
export function shortInput(name, input, dir) {
  if (input === null || input === undefined) return "";
  if (typeof input !== "object") return String(input);
  const s = (v) => (typeof v === "string" ? v : "");
  switch (name) {
    case "Bash":
      return s(input.command);
    case "Read":
    case "Edit":
    case "MultiEdit":
    case "Write":
      return relPath(s(input.file_path), dir);
    case "NotebookEdit":
      return s(input.notebook_path);
    case "Glob":
    case "Grep":
      return s(input.pattern) + (input.path ? " in " + s(input.path) : "");
    case "WebFetch":
      return s(input.url);
    case "WebSearch":
      return s(input.query);
    case "Agent":
    case "Task":
      return s(input.description) || s(input.prompt);
    case "TodoWrite":
      return Array.isArray(input.todos) ? input.todos.length + " to-dos" : "";
    default:
      for (const v of Object.values(input)) if (typeof v === "string" && v) return v;
      for (const v of Object.values(input)) if (Array.isArray(v) && v.length && v.every((x) => typeof x === "string")) return v.join(" ");
      return JSON.stringify(input);
  }
}

// pretty is a tool input as the UI prints it whole: a string as is, else
// indented JSON.
export function pretty(input) {
  if (input === null || input === undefined) return "";
  if (typeof input === "string") return input;
  try {
    return JSON.stringify(input, null, 2);
  } catch {
    return String(input);
  }
}
