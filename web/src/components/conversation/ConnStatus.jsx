const CONN_TEXT = {
  connecting: "Connecting…",
  connected: "Connected",
  reconnecting: "Reconnecting…",
  offline: "Offline",
  gone: "Offline",
  unauthorized: "Offline",
};

// ConnStatus shows whether the live stream is up. Its text is exactly
// "Connected", "Reconnecting…" or "Offline" (and "Connecting…" at first).
export function ConnStatus({ conn }) {
  const s = conn.state;
  const wait = conn.retryInMs && (s === "reconnecting" || s === "offline") ? `next try in ${Math.ceil(conn.retryInMs / 1000)} s` : "";
  return (
    <span class={"conn " + s} title={wait || undefined}>
      <span class="conn-dot" aria-hidden="true" />
      <span role="status" data-testid="connection">
        {CONN_TEXT[s] || s}
      </span>
    </span>
  );
}
