// The TalkIDE browser UI: conversations with the coding agent, their live
// turns, permission requests, spend, issues and builds. See docs/ui.md.
import { render } from "preact";
import "./main.css";
import { App } from "./components/App.jsx";

render(<App />, document.getElementById("app"));
