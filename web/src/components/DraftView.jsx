import { useState } from "preact/hooks";
import { api, newID } from "../lib/api.js";
import { Composer } from "./Composer.jsx";
import { TopBar } from "./TopBar.jsx";

// The sample projects a conversation can start from (the worker's
// internal/worker/samples).
const SAMPLES = [{ value: "java-calculator", label: "java-calculator: a small Java project with JUnit tests" }];

// DraftView: a conversation not created yet. The first message creates it
// (in the workspace the sidebar shows, from the chosen sample) and is then
// sent; nothing is created until then.
export function DraftView(props) {
  const { te, grants, onCreated } = props;
  const [sample, setSample] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState("");
  const [draftText, setDraftText] = useState(null);

  const create = async (text) => {
    if (!te) return;
    setBusy(true);
    setError("");
    try {
      const body = { tenant: te.tenant, env: te.env };
      if (sample) body.sample = sample;
      const c = await api("POST", "/api/conversations", body);
      onCreated(c.id, [{ cmid: newID(), text, state: "sending" }]);
    } catch (e) {
      setError(e.message);
      setDraftText(text);
      setBusy(false);
    }
  };

  return (
    <>
      <TopBar {...props}>
        <h1 class="conv-h">New conversation</h1>
        {te && <span class="te-tag">{te.tenant + " / " + te.env}</span>}
      </TopBar>
      <div class="scroller">
        <div class="timeline">
          <div class="welcome">
            <h2>What should the agent do?</h2>
            <p class="muted">
              The agent works in its own project folder{te ? ` in ${te.tenant} / ${te.env}` : ""}: it can read and edit files, run commands and builds,
              and file issues. It asks before it uses a tool when your workspace requires that.
            </p>
            <label class="field">
              <span class="label">Start from</span>
              <select value={sample} onChange={(e) => setSample(e.currentTarget.value)} disabled={busy}>
                <option value="">An empty project</option>
                {SAMPLES.map((s) => (
                  <option value={s.value}>{s.label}</option>
                ))}
              </select>
            </label>
            {!te && grants.length === 0 && <p class="form-error">You have no workspace to start a conversation in.</p>}
            {error && (
              <p class="form-error" role="alert">
                Could not start the conversation: {error}
              </p>
            )}
            {draftText && error && (
              <div class="msg user">
                <div class="bubble">{draftText}</div>
                <div class="msg-state">
                  <button type="button" class="ghost small" onClick={() => create(draftText)} disabled={busy}>
                    Retry
                  </button>
                </div>
              </div>
            )}
          </div>
        </div>
      </div>
      <Composer onSend={create} disabled={busy || !te} placeholder={busy ? "Starting the conversation…" : "Message the agent to start"} />
    </>
  );
}
