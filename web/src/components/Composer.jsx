import { useEffect, useRef, useState } from "preact/hooks";

const wantsAutofocus = () => typeof matchMedia === "function" && matchMedia("(pointer: fine)").matches;

// Composer: the message box. Enter sends, Shift+Enter starts a new line;
// while a turn runs, a sent message waits its turn on the worker (shown
// "Queued") and Interrupt stops the running turn.
export function Composer({ onSend, running, onInterrupt, interrupting, disabled, placeholder, autoFocus = true }) {
  const [text, setText] = useState("");
  const ref = useRef(null);
  // Focus the box when it appears, and again when it becomes usable (a new
  // conversation's box is disabled until its tenant-env is known).
  useEffect(() => {
    if (autoFocus && !disabled && ref.current && wantsAutofocus()) ref.current.focus();
  }, [disabled]);
  const send = () => {
    const t = text;
    if (!t.trim() || disabled) return;
    setText("");
    onSend(t);
    if (ref.current) ref.current.focus();
  };
  return (
    <form
      class="composer"
      onSubmit={(e) => {
        e.preventDefault();
        send();
      }}
    >
      <label for="composer-text" class="sr-only">
        Message
      </label>
      <textarea
        id="composer-text"
        ref={ref}
        rows={1}
        value={text}
        placeholder={placeholder || (running ? "Message the agent; it reads it when this turn ends" : "Message the agent")}
        aria-describedby="composer-hint"
        onInput={(e) => setText(e.currentTarget.value)}
        onKeyDown={(e) => {
          if (e.key === "Enter" && !e.shiftKey && !e.altKey && !e.ctrlKey && !e.metaKey && !e.isComposing && e.keyCode !== 229) {
            e.preventDefault();
            send();
          }
        }}
      />
      <div class="composer-bar">
        <span id="composer-hint" class="hint">
          <kbd>Enter</kbd> to send · <kbd>Shift</kbd>+<kbd>Enter</kbd> for a new line
        </span>
        <span class="composer-buttons">
          {onInterrupt && (
            <button type="button" class="danger-outline" disabled={!running || interrupting} onClick={onInterrupt}>
              {interrupting ? "Interrupting…" : "Interrupt"}
            </button>
          )}
          <button type="submit" class="primary" disabled={disabled || !text.trim()}>
            Send
          </button>
        </span>
      </div>
    </form>
  );
}
