import { parseBlocks } from "../lib/markdown.js";

// Markdown renders the agent's text as text nodes in a few block and
// inline elements; it never produces HTML from the text.
export function Markdown({ text }) {
  return (
    <div class="md">
      {parseBlocks(text).map((b) => {
        switch (b.type) {
          case "code":
            return (
              <pre class="code" data-lang={b.lang || undefined}>
                <code>{b.text}</code>
              </pre>
            );
          case "heading": {
            // Headings of the agent's text are not page headings.
            return (
              <p class={"md-h md-h" + b.level}>
                <Inline parts={b.inlines} />
              </p>
            );
          }
          case "list": {
            const items = b.items.map((it) => (
              <li>
                <Inline parts={it} />
              </li>
            ));
            return b.ordered ? <ol start={b.start}>{items}</ol> : <ul>{items}</ul>;
          }
          default:
            return (
              <p>
                <Inline parts={b.inlines} />
              </p>
            );
        }
      })}
    </div>
  );
}

export function Inline({ parts }) {
  return parts.map((p) => {
    switch (p.type) {
      case "code":
        return <code>{p.text}</code>;
      case "strong":
        return <strong>{p.text}</strong>;
      case "em":
        return <em>{p.text}</em>;
      default:
        return p.text;
    }
  });
}
