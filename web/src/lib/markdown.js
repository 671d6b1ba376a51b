import { visible } from "./format.js";

// A light reading of the agent's Markdown into plain data that components
// render as text nodes: fenced code blocks, headings, lists, paragraphs, and
// inline code, bold and italics. The agent's text is never HTML to this
// page: nothing here produces markup, so nothing it writes can inject any.

// parseBlocks(text) returns [{type: "code", lang, text} | {type: "heading",
// level, inlines} | {type: "list", ordered, items: [inlines]} |
// {type: "p", inlines}].
export function parseBlocks(text) {
  const lines = visible(text).replace(/\r\n?/g, "\n").split("\n");
  const blocks = [];
  let para = [];
  let list = null;
  const flushPara = () => {
    if (para.length) blocks.push({ type: "p", inlines: parseInline(para.join("\n")) });
    para = [];
  };
  const flushList = () => {
    if (list) blocks.push(list);
    list = null;
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = /^\s{0,3}(`{3,}|~{3,})\s*([\w+.#-]*)/.exec(line);
    if (fence) {
      flushPara();
      flushList();
      const marker = fence[1];
      const body = [];
      i++;
      while (i < lines.length && !(lines[i].trimStart().startsWith(marker) && lines[i].trim().replace(/[`~]/g, "") === "")) {
        body.push(lines[i]);
        i++;
      }
      blocks.push({ type: "code", lang: fence[2] || "", text: body.join("\n") });
      continue;
    }
    if (line.trim() === "") {
      flushPara();
      flushList();
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      flushPara();
      flushList();
      blocks.push({ type: "heading", level: heading[1].length, inlines: parseInline(heading[2]) });
      continue;
    }
    const item = /^\s{0,3}(?:([-*+])|(\d{1,9})[.)])\s+(.*)$/.exec(line);
    if (item) {
      flushPara();
      const ordered = !item[1];
      if (!list || list.ordered !== ordered) {
        flushList();
        list = { type: "list", ordered, start: ordered ? Number(item[2]) : 1, items: [] };
      }
      list.items.push(parseInline(item[3]));
      continue;
    }
    if (list && /^\s{2,}\S/.test(line)) {
      // A continuation line of the last item.
      const last = list.items.length - 1;
      list.items[last] = list.items[last].concat([{ type: "text", text: "\n" }], parseInline(line.trim()));
      continue;
    }
    flushList();
    para.push(line);
  }
  flushPara();
  flushList();
  return blocks;
}

// parseInline(s) returns [{type: "text" | "code" | "strong" | "em", text}].
export function parseInline(s) {
  const out = [];
  const push = (type, text) => {
    if (!text) return;
    const last = out[out.length - 1];
    if (type === "text" && last && last.type === "text") last.text += text;
    else out.push({ type, text });
  };
  let i = 0;
  let plain = "";
  while (i < s.length) {
    const ch = s[i];
    if (ch === "`") {
      let n = 1;
      while (s[i + n] === "`") n++;
      const tick = "`".repeat(n);
      const end = s.indexOf(tick, i + n);
      if (end > i + n - 1 && end !== -1) {
        push("text", plain);
        plain = "";
        let code = s.slice(i + n, end);
        if (code.length > 2 && code[0] === " " && code[code.length - 1] === " ") code = code.slice(1, -1);
        push("code", code);
        i = end + n;
        continue;
      }
      plain += tick;
      i += n;
      continue;
    }
    // Only asterisks emphasise: underscores are common inside names
    // (mcp__server__tool, snake_case) and stay as written.
    if (ch === "*" && s[i + 1] === ch) {
      const end = s.indexOf(ch + ch, i + 2);
      if (end > i + 2) {
        push("text", plain);
        plain = "";
        push("strong", s.slice(i + 2, end));
        i = end + 2;
        continue;
      }
    }
    if (ch === "*" && s[i + 1] !== " " && s[i + 1] !== "*") {
      const end = s.indexOf("*", i + 1);
      if (end > i + 1 && s[end - 1] !== " ") {
        push("text", plain);
        plain = "";
        push("em", s.slice(i + 1, end));
        i = end + 1;
        continue;
      }
    }
    plain += ch;
    i++;
  }
  push("text", plain);
  return out;
}
