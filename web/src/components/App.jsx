import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { api, ApiError, paths, setToken, setUnauthorizedHandler, takeTokenFromHash, token } from "../lib/api.js";
import { SignIn } from "./SignIn.jsx";
import { Sidebar } from "./Sidebar.jsx";
import { ConversationView } from "./conversation/ConversationView.jsx";
import { DraftView } from "./DraftView.jsx";
import { IssuesPanel } from "./IssuesPanel.jsx";
import { useConversationList } from "../lib/conversationList.js";

const TE_KEY = "talkide-tenant-env";

function teKey(te) {
  return te ? te.tenant + "/" + te.env : "";
}

function storedTE() {
  try {
    const [tenant, env] = (localStorage.getItem(TE_KEY) || "").split("/");
    return tenant && env ? { tenant, env } : null;
  } catch {
    return null;
  }
}

function convFromURL() {
  return new URLSearchParams(location.search).get("c") || "";
}

export function App() {
  const [tok, setTok] = useState(() => {
    takeTokenFromHash();
    return token();
  });
  const [signInError, setSignInError] = useState("");
  const [me, setMe] = useState(null); // GET /api/me answer
  const [meError, setMeError] = useState("");
  const [te, setTE] = useState(null); // the tenant-env the list shows
  const [convId, setConvId] = useState(convFromURL);
  const [handoff, setHandoff] = useState(null); // {id, pending} from the draft
  const [drawer, setDrawer] = useState(false);
  const [issuesOpen, setIssuesOpen] = useState(false);
  const [live, setLive] = useState({}); // the open conversation, from its stream
  const issuesButton = useRef(null);

  const signOut = useCallback((msg) => {
    setToken("");
    setTok("");
    setMe(null);
    setSignInError(msg || "");
  }, []);

  // A #token= link opened in a tab already showing the UI changes only the
  // hash (no page load): take the token, drop it from the address, and
  // start over as that user.
  useEffect(() => {
    const onHash = () => {
      if (!new URLSearchParams(location.hash.slice(1)).get("token")) return;
      takeTokenFromHash();
      location.reload();
    };
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);

  useEffect(() => {
    setUnauthorizedHandler(() => signOut("The server did not accept your token (it may have been revoked). Sign in again."));
  }, [signOut]);

  // The user and their grants; the budget of the current tenant.
  const loadMe = useCallback(
    async (tenant) => {
      try {
        const m = await api("GET", paths.me(tenant));
        setMe(m);
        setMeError("");
        return m;
      } catch (e) {
        if (e instanceof ApiError && (e.status === 404 || e.status === 405)) {
          // A control plane without GET /api/me: the one-machine grant.
          const m = { user: "", grants: [storedTE() || { tenant: "demo", env: "dev" }], budget: null };
          setMe(m);
          return m;
        }
        if (e instanceof ApiError && e.status === 401) return null;
        setMeError(e.message);
        return null;
      }
    },
    [],
  );

  useEffect(() => {
    if (!tok) return;
    let stop = false;
    (async () => {
      const m = await loadMe("");
      if (stop || !m) return;
      const grants = m.grants || [];
      const want = storedTE();
      const pick = grants.find((g) => want && g.tenant === want.tenant && g.env === want.env) || grants[0] || null;
      setTE((cur) => cur || pick);
    })();
    return () => {
      stop = true;
    };
  }, [tok, loadMe]);

  // The budget follows the tenant.
  useEffect(() => {
    if (tok && te) loadMe(te.tenant);
  }, [tok, te && te.tenant, loadMe]);

  useEffect(() => {
    if (!te) return;
    try {
      localStorage.setItem(TE_KEY, teKey(te));
    } catch {
      // not kept: fine
    }
  }, [te && teKey(te)]);

  // The address follows the open conversation; Back and Forward move
  // between them.
  useEffect(() => {
    const f = () => {
      setConvId(convFromURL());
      setDrawer(false);
    };
    window.addEventListener("popstate", f);
    return () => window.removeEventListener("popstate", f);
  }, []);

  const open = useCallback((id, { replace = false } = {}) => {
    const url = id ? "?c=" + encodeURIComponent(id) : location.pathname;
    if (id !== convFromURL() || replace) {
      (replace ? history.replaceState : history.pushState).call(history, { c: id }, "", url);
    }
    setConvId(id);
    setLive({});
    setDrawer(false);
  }, []);

  const list = useConversationList(tok && te ? te : null);

  const onMeta = useCallback(
    (conv) => {
      // A link to a conversation of another tenant-env shows that one's list.
      if (!conv || !me) return;
      if (te && conv.tenant === te.tenant && conv.env === te.env) return;
      const g = (me.grants || []).find((g) => g.tenant === conv.tenant && g.env === conv.env);
      if (g) setTE({ tenant: g.tenant, env: g.env });
    },
    [me, te && teKey(te)],
  );

  const onDeleted = useCallback(() => {
    open("", { replace: true });
    list.refresh();
  }, [open, list.refresh]);

  // The opened drawer takes the focus; closed, it gives it back.
  useEffect(() => {
    const el = document.querySelector(drawer ? "#sidebar .new-conv" : ".drawer-toggle");
    if (el && (drawer || document.activeElement === document.body || document.activeElement?.closest("#sidebar"))) el.focus();
  }, [drawer]);

  // Esc closes the drawer or the issues panel.
  useEffect(() => {
    const f = (e) => {
      if (e.key !== "Escape" || e.defaultPrevented) return;
      if (drawer) setDrawer(false);
      else if (issuesOpen) {
        setIssuesOpen(false);
        issuesButton.current && issuesButton.current.focus();
      }
    };
    window.addEventListener("keydown", f);
    return () => window.removeEventListener("keydown", f);
  }, [drawer, issuesOpen]);

  if (!tok) {
    return (
      <SignIn
        error={signInError}
        onSignIn={async (t) => {
          setToken(t);
          try {
            await api("GET", paths.me(""));
          } catch (e) {
            if (e instanceof ApiError && e.status === 401) {
              setToken("");
              setSignInError("That token was not accepted. Check it and try again.");
              return;
            }
            // Another failure (no /api/me yet, network): go on; calls will say.
          }
          setSignInError("");
          setTok(t);
        }}
      />
    );
  }

  const budget = me && me.budget;
  const toggleIssues = () => setIssuesOpen((v) => !v);
  const common = {
    te,
    drawerOpen: drawer,
    onToggleDrawer: () => setDrawer((v) => !v),
    issuesOpen,
    onToggleIssues: toggleIssues,
    issuesButton,
  };

  return (
    <div class={"app" + (drawer ? " drawer-open" : "") + (issuesOpen ? " issues-open" : "")}>
      <Sidebar
        me={me}
        meError={meError}
        te={te}
        onTE={(g) => {
          setTE(g);
          if (convId) open("");
        }}
        list={list}
        current={convId}
        live={live}
        onOpen={(id) => open(id)}
        onNew={() => open("")}
        onSignOut={() => signOut("")}
        budget={budget}
      />
      <div class="scrim" onClick={() => setDrawer(false)} aria-hidden="true" />
      <main class="main">
        {convId ? (
          <ConversationView
            key={convId}
            id={convId}
            {...common}
            budget={budget}
            initialPending={handoff && handoff.id === convId ? handoff.pending : null}
            onMeta={onMeta}
            onLive={setLive}
            onTurnEnd={() => te && loadMe(te.tenant)}
            onChanged={list.refresh}
            onDeleted={onDeleted}
          />
        ) : (
          <DraftView
            {...common}
            grants={(me && me.grants) || []}
            onCreated={(id, pending) => {
              setHandoff({ id, pending });
              open(id);
              list.refresh();
            }}
          />
        )}
      </main>
      {issuesOpen && te && (
        <IssuesPanel
          te={te}
          onOpen={(id) => open(id)}
          onClose={() => {
            setIssuesOpen(false);
            issuesButton.current && issuesButton.current.focus();
          }}
        />
      )}
    </div>
  );
}
