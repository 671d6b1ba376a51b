// A stand-in for the browser UI until the real app lands (issue 15): the
// page title and the sign-in form, so the build, the embedding and the
// browser-test harness have something real to work on.
import { render } from "preact";
import "./main.css";

function App() {
  return (
    <main>
      <h1>TalkIDE</h1>
      <form onSubmit={(e) => e.preventDefault()}>
        <label>
          User token <input type="password" name="token" autocomplete="off" />
        </label>
        <button type="submit">Sign in</button>
      </form>
    </main>
  );
}

render(<App />, document.getElementById("app"));
