import { UserMessage } from "../timeline/UserMessage.jsx";

// LocalMessages are the messages this tab sent that the stream has not
// shown yet: "Sending…", "Queued", or not sent, with Retry (send(text,
// cmid) sends it again under its id).
export function LocalMessages({ store, send }) {
  return store.state.pending.map((p) => (
    <div key={p.cmid}>
      <UserMessage item={{ cmid: p.cmid, text: p.text }} state={p.state === "failed" ? "" : p.state} />
      {p.state === "failed" && (
        <p class="send-error" role="alert">
          Not sent: {p.error}{" "}
          <button type="button" class="ghost small" onClick={() => send(p.text, p.cmid)}>
            Retry
          </button>
        </p>
      )}
    </div>
  ));
}
