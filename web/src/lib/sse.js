// A parser of text/event-stream (WHATWG HTML, server-sent events) for
// streams read with fetch(): the conversation stream needs an Authorization
// header, which EventSource cannot send.
//
// Feed it decoded text in chunks of any size; it calls onEvent for every
// complete event with {id, event, data} (id and event as sent, or "" when
// the event had none). Comment lines (": heartbeat") are ignored.
export class SSEParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buf = "";
    this.reset();
  }

  reset() {
    this.id = "";
    this.event = "";
    this.data = [];
  }

  feed(text) {
    this.buf += text;
    // Lines end with \n, \r\n or \r; a lone \r at the end may be the first
    // half of \r\n, so it waits for the next chunk.
    let start = 0;
    for (;;) {
      let i = start;
      const n = this.buf.length;
      while (i < n && this.buf[i] !== "\n" && this.buf[i] !== "\r") i++;
      if (i >= n) break;
      if (this.buf[i] === "\r" && i + 1 >= n) break;
      const line = this.buf.slice(start, i);
      start = this.buf[i] === "\r" && this.buf[i + 1] === "\n" ? i + 2 : i + 1;
      this.line(line);
    }
    this.buf = this.buf.slice(start);
  }

  line(line) {
    if (line === "") {
      if (this.data.length > 0) {
        this.onEvent({ id: this.id, event: this.event, data: this.data.join("\n") });
      }
      this.reset();
      return;
    }
    if (line[0] === ":") return;
    const c = line.indexOf(":");
    const field = c < 0 ? line : line.slice(0, c);
    let value = c < 0 ? "" : line.slice(c + 1);
    if (value[0] === " ") value = value.slice(1);
    switch (field) {
      case "id":
        this.id = value;
        break;
      case "event":
        this.event = value;
        break;
      case "data":
        this.data.push(value);
        break;
      default:
    }
  }
}
