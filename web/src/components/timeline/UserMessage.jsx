// UserMessage is a message of the user's, from the stream or (state set)
// sent from this tab and not on the stream yet.
export function UserMessage({ item, state }) {
  // state: "sending" | "queued" | "failed" for messages not in the stream yet.
  const queued = item.queued || state === "queued" || state === "sending";
  return (
    <div class={"msg user" + (queued ? " is-queued" : "")} data-event-id={item.id || undefined} data-client-message-id={item.cmid}>
      <div class="bubble">{item.text}</div>
      {queued && (
        <div class="msg-state">
          <span class="badge">{state === "sending" ? "Sending…" : "Queued"}</span>
        </div>
      )}
    </div>
  );
}
