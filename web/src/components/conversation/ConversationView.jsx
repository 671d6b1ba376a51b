import { useCallback, useEffect, useLayoutEffect, useMemo, useRef } from "preact/hooks";
import { useConversation } from "../../lib/conversation.js";
import { oneLine } from "../../lib/format.js";
import { Composer } from "../Composer.jsx";
import { ItemView } from "../timeline/ItemView.jsx";
import { TopBar } from "../TopBar.jsx";
import { ConversationHeader } from "./ConversationHeader.jsx";
import { LocalMessages } from "./LocalMessages.jsx";
import { Working } from "./Working.jsx";

// ConversationView: one conversation, live: its header, the timeline from
// its event stream, and the composer, all over one store of its state
// (lib/conversation.js). Besides TopBar's props it takes id, te, budget,
// initialPending (messages handed over from the new-conversation page) and
// what App is told: onMeta(record), onLive({ id, running, pending, title,
// lastActivity }), onTurnEnd(), onChanged() (the list may have changed)
// and onDeleted().
export function ConversationView(props) {
  const { id, te, budget, initialPending, onMeta, onLive, onTurnEnd, onChanged, onDeleted } = props;
  const store = useConversation(id, initialPending, { onMeta, onTurnEnd, onChanged });
  const { state } = store;
  const tl = state.tl;

  // What the list shows of this conversation comes from the stream.
  const running = store.running();
  const pendingPerms = store.pendingPermissions();
  const title = store.title();
  useEffect(() => {
    onLive({ id, running, pending: pendingPerms, title, lastActivity: store.lastActivity() });
  }, [id, running, pendingPerms, title, tl.lastId]);
  useEffect(() => {
    document.title = (title ? oneLine(title, 50) + " · " : "") + "TalkIDE";
    return () => {
      document.title = "TalkIDE";
    };
  }, [title]);

  // Follow the newest output unless the reader scrolled up; sending a
  // message follows it again.
  const scroller = useRef(null);
  const stick = useRef(true);
  const send = useCallback(
    (text, cmid) => {
      stick.current = true;
      store.send(text, cmid);
    },
    [store],
  );
  const workDir = store.workDir();
  const ctx = useMemo(() => ({ conv: id, answer: store.answer, budget, workDir, resend: send }), [id, store, budget, workDir, send]);
  useLayoutEffect(() => {
    const el = scroller.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  });
  const onScroll = () => {
    const el = scroller.current;
    if (el) stick.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80;
  };

  if (state.gone) {
    return (
      <>
        <TopBar {...props}>
          <h1 class="conv-h">Conversation not found</h1>
        </TopBar>
        <div class="empty-state">
          <p>{state.gone}</p>
          <p>
            <a href={location.pathname} onClick={(e) => (e.preventDefault(), onDeleted())}>
              Start a new conversation
            </a>
          </p>
        </div>
      </>
    );
  }

  const empty = tl.items.length === 0 && tl.queue.length === 0 && state.pending.length === 0;
  return (
    <>
      <ConversationHeader store={store} bar={props} te={te} onDeleted={onDeleted} />
      {state.actionError && (
        <p class="banner error" role="alert">
          {state.actionError}
        </p>
      )}
      <div class="scroller" ref={scroller} onScroll={onScroll}>
        <div class="timeline">
          {empty && (
            <div class="empty-state">
              <p class="muted">{state.conn.state === "connected" ? "No messages yet. Ask the agent something to start." : "Loading the conversation…"}</p>
            </div>
          )}
          {tl.items.map((it) => (
            <ItemView key={it.id} item={it} v={it.v} ctx={ctx} />
          ))}
          {running && <Working tl={tl} interrupting={state.interrupting} />}
          {tl.queue.map((it) => (
            <ItemView key={it.id} item={it} v={it.v} ctx={ctx} />
          ))}
          <LocalMessages store={store} send={send} />
        </div>
      </div>
      <div class="sr-only" aria-live="polite">
        {state.announce}
      </div>
      <Composer onSend={(t) => send(t)} running={running} onInterrupt={store.interrupt} interrupting={state.interrupting} />
    </>
  );
}
