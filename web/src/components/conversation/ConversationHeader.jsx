import { useEffect, useRef, useState } from "preact/hooks";
import { Icon } from "../Icon.jsx";
import { TopBar } from "../TopBar.jsx";
import { ConnStatus } from "./ConnStatus.jsx";
import { DeleteConfirm } from "./DeleteConfirm.jsx";
import { RenameForm } from "./RenameForm.jsx";

// ConversationHeader is the bar above a conversation (its title, tenant-env
// and badges, the connection, Rename and Delete) and the delete dialog
// below it. bar: TopBar's props; te: the tenant-env shown until the record
// is read; onDeleted: called once the conversation is deleted.
export function ConversationHeader({ store, bar, te, onDeleted }) {
  const { state } = store;
  const [editing, setEditing] = useState(false);
  const [confirming, setConfirming] = useState(false);
  // Cancelling the delete dialog (Esc or Cancel) puts the focus back on the
  // button that opened it.
  const deleteButton = useRef(null);
  const wasConfirming = useRef(false);
  useEffect(() => {
    if (wasConfirming.current && !confirming && deleteButton.current) deleteButton.current.focus();
    wasConfirming.current = confirming;
  }, [confirming]);

  const title = store.title();
  const meta = state.meta;
  const teLabel = meta ? meta.tenant + " / " + meta.env : te ? te.tenant + " / " + te.env : "";
  const pendingPerms = store.pendingPermissions();
  const actions = (
    <>
      <ConnStatus conn={state.conn} />
      {!editing && !confirming && (
        <>
          <button type="button" class="ghost with-icon" onClick={() => setEditing(true)}>
            <Icon name="pencil" />
            <span class="btn-label">Rename</span>
          </button>
          <button type="button" class="ghost with-icon" ref={deleteButton} onClick={() => setConfirming(true)}>
            <Icon name="trash" />
            <span class="btn-label">Delete conversation</span>
          </button>
        </>
      )}
    </>
  );
  return (
    <>
      <TopBar {...bar} actions={actions}>
        {editing ? (
          <RenameForm
            initial={title}
            onCancel={() => setEditing(false)}
            onSave={async (t) => {
              await store.rename(t);
              setEditing(false);
            }}
          />
        ) : (
          <>
            <h1 class="conv-h" title={title || "Untitled"}>
              {title || "Untitled"}
            </h1>
            <span class="te-tag">{teLabel}</span>
            {store.running() && <span class="badge run">Running</span>}
            {pendingPerms > 0 && <span class="badge warn">Needs approval</span>}
          </>
        )}
      </TopBar>
      {confirming && (
        <DeleteConfirm
          onCancel={() => setConfirming(false)}
          onDelete={async () => {
            await store.remove();
            onDeleted();
          }}
        />
      )}
    </>
  );
}
