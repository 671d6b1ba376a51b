import { Icon } from "./Icon.jsx";

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
        <Icon name="menu" />
      </button>
      <div class="title-area">{children}</div>
      <div class="top-actions">
        {actions}
        <button type="button" class={"ghost with-icon" + (issuesOpen ? " pressed" : "")} ref={issuesButton} aria-expanded={issuesOpen ? "true" : "false"} onClick={onToggleIssues}>
          <Icon name="issues" />
          <span class="btn-label">Issues</span>
        </button>
      </div>
    </header>
  );
}
