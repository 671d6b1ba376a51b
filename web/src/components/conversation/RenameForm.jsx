import { useEffect, useRef, useState } from "preact/hooks";

// RenameForm edits a title in place: Enter saves (an error stays in the
// form), Esc or Cancel gives up.
export function RenameForm({ initial, onSave, onCancel }) {
  const [v, setV] = useState(initial || "");
  const [err, setErr] = useState("");
  const [busy, setBusy] = useState(false);
  const ref = useRef(null);
  useEffect(() => {
    if (ref.current) {
      ref.current.focus();
      ref.current.select();
    }
  }, []);
  return (
    <form
      class="rename"
      onSubmit={async (e) => {
        e.preventDefault();
        const t = v.trim();
        setBusy(true);
        try {
          await onSave(t);
        } catch (e2) {
          setErr(e2.message);
          setBusy(false);
        }
      }}
    >
      <label for="rename-title" class="sr-only">
        Title
      </label>
      <input
        id="rename-title"
        ref={ref}
        type="text"
        value={v}
        maxLength={200}
        onInput={(e) => setV(e.currentTarget.value.replace(/[\r\n]+/g, " "))}
        onKeyDown={(e) => {
          if (e.key === "Escape") {
            e.preventDefault();
            onCancel();
          }
        }}
        aria-invalid={err ? "true" : undefined}
        aria-describedby={err ? "rename-error" : undefined}
      />
      <button type="submit" class="primary" disabled={busy}>
        Save
      </button>
      <button type="button" class="ghost" onClick={onCancel}>
        Cancel
      </button>
      {err && (
        <span id="rename-error" class="form-error small" role="alert">
          {err}
        </span>
      )}
    </form>
  );
}
