import { useState } from "preact/hooks";

// SignIn asks for the user token when the page was opened without one
// (the links `make run` and `talkide user add` print carry it as #token=…).
export function SignIn({ error, onSignIn }) {
  const [value, setValue] = useState("");
  const [busy, setBusy] = useState(false);
  return (
    <main class="signin">
      <form
        class="signin-card"
        onSubmit={async (e) => {
          e.preventDefault();
          const t = value.trim();
          if (!t || busy) return;
          setBusy(true);
          try {
            await onSignIn(t);
          } finally {
            setBusy(false);
          }
        }}
      >
        <h1>
          <span class="logo" aria-hidden="true">
            ◆
          </span>{" "}
          TalkIDE
        </h1>
        <p class="muted">Sign in with your user token to talk to the coding agent.</p>
        <label for="token-input">User token</label>
        <input
          id="token-input"
          type="password"
          autocomplete="current-password"
          value={value}
          onInput={(e) => setValue(e.currentTarget.value)}
          aria-describedby={error ? "signin-error" : "signin-help"}
          autoFocus
        />
        {error && (
          <p id="signin-error" class="form-error" role="alert">
            {error}
          </p>
        )}
        <button type="submit" class="primary" disabled={busy || !value.trim()}>
          {busy ? "Signing in…" : "Sign in"}
        </button>
        <p id="signin-help" class="muted small">
          <code>make run</code> (or <code>bin/talkide user add NAME</code>) prints the token and a link that signs you in. The token stays in this tab only.
        </p>
      </form>
    </main>
  );
}
