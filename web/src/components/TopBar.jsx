// TopBar: the bar above a conversation: the drawer button on narrow
// screens, the title (or what replaces it), actions, and the Issues
// button.
export function TopBar({ drawerOpen, onToggleDrawer, issuesOpen, onToggleIssues, issuesButton, children, actions }) {
  return (
    <header class="topbar">
      <button
        type="button"
        class="icon-btn drawer-toggle"
        aria-expanded={drawerOpen ? "true" : "false"}
        aria-controls="sidebar"
        aria-label="Show conversations"
        onClick={onToggleDrawer}
      >
        <span aria-hidden="true">☰</span>
      </button>
      <div class="title-area">{children}</div>
      <div class="top-actions">
        {actions}
        <button type="button" class={"ghost" + (issuesOpen ? " pressed" : "")} ref={issuesButton} aria-expanded={issuesOpen ? "true" : "false"} onClick={onToggleIssues}>
          Issues
        </button>
      </div>
    </header>
  );
}
