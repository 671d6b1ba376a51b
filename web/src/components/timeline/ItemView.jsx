import { Component } from "preact";
import { Markdown } from "../Markdown.jsx";
import { BuildCard } from "./BuildCard.jsx";
import { PermissionRequest } from "./PermissionRequest.jsx";
import { ToolCall } from "./ToolCall.jsx";
import { TurnEnd } from "./TurnEnd.jsx";
import { TurnFailed } from "./TurnFailed.jsx";
import { UserMessage } from "./UserMessage.jsx";

// ItemView renders one timeline item and re-renders only when the item
// changed (its `v`) or the shared context did.
export class ItemView extends Component {
  shouldComponentUpdate(next) {
    return next.item !== this.props.item || next.v !== this.props.v || next.ctx !== this.props.ctx;
  }

  render({ item, ctx }) {
    switch (item.kind) {
      case "user":
        return <UserMessage item={item} />;
      case "text":
        return (
          <div class="msg assistant" data-event-id={item.id}>
            <Markdown text={item.text} />
          </div>
        );
      case "tool":
        return <ToolCall item={item} ctx={ctx} />;
      case "perm":
        return <PermissionRequest item={item} ctx={ctx} />;
      case "build":
        return <BuildCard item={item} />;
      case "turn-end":
        return <TurnEnd item={item} ctx={ctx} />;
      case "failed":
        return <TurnFailed item={item} ctx={ctx} />;
      case "notice":
        return (
          <div class={"notice " + item.level} data-event-id={item.id} role={item.level === "error" ? "alert" : undefined}>
            {item.title && <strong>{item.title}: </strong>}
            {item.text}
          </div>
        );
      default:
        return null;
    }
  }
}
