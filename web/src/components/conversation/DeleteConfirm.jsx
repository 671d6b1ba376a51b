import { useEffect, useRef, useState } from "preact/hooks";

// DeleteConfirm asks before a conversation is deleted; Esc or Cancel gives
// up, an error stays in the dialog.
export function DeleteConfirm({ onDelete, onCancel }) {
  const [busy, setBusy] = useState(false);
  const [err, setErr] = useState("");
  const ref = useRef(null);
  useEffect(() => {
    if (ref.current) ref.current.focus();
  }, []);
  return (
    <div
      class="banner confirm"
      role="alertdialog"
      aria-labelledby="delete-q"
      aria-describedby="delete-d"
      onKeyDown={(e) => {
        if (e.key === "Escape") {
          e.preventDefault();
          e.stopPropagation();
          onCancel();
        }
      }}
    >
      <div>
        <strong id="delete-q">Delete this conversation?</strong>{" "}
        <span id="delete-d">Its messages and the agent's files on the worker are removed for good.</span>
        {err && (
          <span class="form-error small" role="alert">
            {" "}
            {err}
          </span>
        )}
      </div>
      <div class="confirm-buttons">
        <button type="button" class="ghost" ref={ref} onClick={onCancel}>
          Cancel
        </button>
        <button
          type="button"
          class="danger"
          disabled={busy}
          onClick={async () => {
            setBusy(true);
            try {
              await onDelete();
            } catch (e) {
              setErr(e.message);
              setBusy(false);
            }
          }}
        >
          Delete
        </button>
      </div>
    </div>
  );
}
