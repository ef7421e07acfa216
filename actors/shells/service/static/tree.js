/* loopd's page, the part without a DOM: the server-sent-events parser, the model of one
   session family's live tree, and the list of calls waiting for a person. It runs in the browser (as window.LoopdTree) and under Node
   (module.exports), where the tests feed it a real event stream. */
(function (root) {
  "use strict";

  /* Server-sent events from text chunks: feed() returns the complete frames so far, each
     {id, event, data}; comment lines (": keepalive") are skipped. */
  function SseParser() {
    this.buffer = "";
    this.frame = { id: null, event: "message", data: [] };
  }

  SseParser.prototype.feed = function (text) {
    const frames = [];
    this.buffer += text;
    let at;
    while ((at = this.buffer.indexOf("\n")) >= 0) {
      const line = this.buffer.slice(0, at).replace(/\r$/, "");
      this.buffer = this.buffer.slice(at + 1);
      if (line === "") {
        if (this.frame.data.length || this.frame.id !== null) {
          frames.push({
            id: this.frame.id,
            event: this.frame.event,
            data: this.frame.data.join("\n"),
          });
        }
        this.frame = { id: null, event: "message", data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") this.frame.data.push(value);
      else if (field === "id") this.frame.id = value;
      else if (field === "event") this.frame.event = value;
    }
    return frames;
  };

  /* The id rule: a descendant k levels down is "sub-" k times, the session, k call numbers. */
  function depthOf(session) {
    let n = 0;
    while (session.startsWith("sub-", 4 * n)) n += 1;
    return n;
  }

  function descendsFrom(candidate, session) {
    const levels = depthOf(candidate) - depthOf(session);
    if (levels < 1) return false;
    const rest = candidate.slice(4 * levels);
    if (!rest.startsWith(session + "-")) return false;
    const numbers = rest.slice(session.length + 1).split("-");
    return numbers.length === levels && numbers.every((n) => /^[0-9]+$/.test(n));
  }

  function endState(completed, reason) {
    if (completed) return "completed";
    return reason === "cancelled" ? "cancelled" : "failed";
  }

  /* One family's tree: nodes by id, each with its state, agent, slot, tokens, times and the
     text of its latest answer (streamed pieces included). */
  function Family(rootId) {
    this.root = rootId;
    this.nodes = new Map();
    this.node(rootId);
  }

  Family.prototype.node = function (id) {
    let found = this.nodes.get(id);
    if (!found) {
      found = {
        id: id, parent: null, children: [], state: "idle", agent: "", slot: null,
        tokens: 0, requests: 0, unmeasured: 0, started: null, ended: null, text: "", tool: null,
        reason: null, detail: "", touched: false, waiting: null, waits: 0, background: false,
        output: undefined,
      };
      this.nodes.set(id, found);
    }
    return found;
  };

  Family.prototype.has = function (session) {
    return session === this.root || descendsFrom(session, this.root);
  };

  Family.prototype.adopt = function (parentId, childId) {
    const parent = this.node(parentId);
    const child = this.node(childId);
    child.parent = parentId;
    if (!parent.children.includes(childId)) parent.children.push(childId);
    return child;
  };

  /* A stored session as GET /v1/sessions/{id} shows it. */
  Family.prototype.seed = function (shown) {
    const n = this.node(shown.session);
    n.agent = shown.agent || n.agent;
    n.slot = shown.slot === undefined ? n.slot : shown.slot;
    // Live events know better than the store (whose answer may have been read before the
    // latest event): only a node no event has touched takes the stored state.
    if (!n.touched) n.state = shown.state || n.state;
    if (shown.background) n.background = true;
    const usage = shown.usage || {};
    if (!n.tokens && !n.requests) {
      n.tokens = (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
      n.requests = usage.requests || 0;
      n.unmeasured = usage.unmeasured_requests || 0;
    }
    if (shown.output !== undefined && n.output === undefined) n.output = shown.output;
    const last = (shown.transcript || []).filter((m) => m.role === "assistant" && m.content);
    if (last.length && !n.text) n.text = last[last.length - 1].content;
    for (const child of shown.children || []) this.adopt(shown.session, child);
  };

  /* Apply one turn event (the decoded data of an SSE frame); false if it is not this
     family's. */
  Family.prototype.apply = function (event) {
    if (!event || typeof event.session !== "string" || !this.has(event.session)) return false;
    const n = this.node(event.session);
    n.touched = true;
    switch (event.type) {
      case "TurnStarted":
        n.state = "running";
        n.slot = event.slot;
        n.output = undefined;
        n.started = event.at;
        n.ended = null;
        n.reason = null;
        n.detail = "";
        n.text = "";
        break;
      case "ModelRequestSent":
        n.slot = event.slot;
        n.text = "";
        break;
      case "TextDelta":
        n.text += event.text;
        break;
      case "ModelAnswered": {
        const usage = event.usage || {};
        n.tokens += (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
        n.requests += usage.requests || 0;
        n.unmeasured += usage.unmeasured_requests || 0;
        if (event.slot !== null && event.slot !== undefined) n.slot = event.slot;
        if (event.content) n.text = event.content;
        break;
      }
      case "ToolCallStarted":
        n.tool = event.name;
        break;
      case "ToolCallFinished":
        n.tool = null;
        break;
      case "SubagentStarted": {
        const child = this.adopt(event.session, event.child);
        child.touched = true;
        child.state = "running";
        child.background = Boolean(event.background);
        child.started = child.started || event.at;
        break;
      }
      case "SubagentFinished": {
        const child = this.adopt(event.session, event.child);
        child.touched = true;
        if (child.state === "running" || child.state === "waiting") {
          child.state = endState(event.completed, event.reason);
        }
        break;
      }
      case "ApprovalRequested":
        n.waiting = event.tool;
        n.waits += 1;
        n.state = "waiting";
        break;
      case "ApprovalSettled":
        n.waits = Math.max(0, n.waits - 1);
        if (!n.waits) {
          n.waiting = null;
          if (n.state === "waiting") n.state = "running";
        }
        break;
      case "TurnEnded":
        n.waiting = null;
        n.waits = 0;
        n.output = event.output === undefined ? null : event.output;
        n.state = endState(event.completed, event.reason);
        n.ended = event.at;
        n.reason = event.reason || null;
        n.detail = event.detail || "";
        n.tool = null;
        break;
      default:
        break;
    }
    return true;
  };

  /* The tree as plain data, root first: {id, state, ..., children: [...]}. */
  Family.prototype.toJSON = function () {
    const walk = (id, depth) => {
      const n = this.nodes.get(id);
      const out = Object.assign({}, n);
      out.children = depth > 64 ? [] : n.children.map((c) => walk(c, depth + 1));
      return out;
    };
    return walk(this.root, 0);
  };

  /* The calls waiting for a person: GET /v1/approvals seeds it, the ApprovalRequested and
     ApprovalSettled events keep it current. A call settled once is never listed again, even
     by a list read before its ApprovalSettled arrived. */
  function Approvals() {
    this.waiting = new Map();
    this.settled = new Set();
  }

  Approvals.key = function (session, callId) {
    return session + "/" + callId;
  };

  /* The list of GET /v1/approvals (its "approvals"). ``before``: the keys known when it was
     asked for (all known now, if not given); those it no longer holds wait no more (settled,
     or dropped by a cancel, which publishes no ApprovalSettled). A request that came as an
     event while the list was on its way stays. */
  Approvals.prototype.load = function (requests, before) {
    const listed = new Set();
    for (const request of requests || []) {
      listed.add(Approvals.key(request.session, request.call_id));
      this.apply(request);
    }
    for (const key of before || Array.from(this.waiting.keys())) {
      if (!listed.has(key)) this.waiting.delete(key);
    }
  };

  /* True if a call of ``session`` is listed as waiting. */
  Approvals.prototype.waits = function (session) {
    for (const request of this.waiting.values()) if (request.session === session) return true;
    return false;
  };

  /* Apply one event; true if the list changed. */
  Approvals.prototype.apply = function (event) {
    if (!event || typeof event.session !== "string") return false;
    const key = Approvals.key(event.session, event.call_id);
    if (event.type === "ApprovalRequested") {
      if (this.settled.has(key) || this.waiting.has(key)) return false;
      this.waiting.set(key, event);
      return true;
    }
    if (event.type === "ApprovalSettled") {
      this.settled.add(key);
      return this.waiting.delete(key);
    }
    return false;
  };

  /* The waiting requests, oldest first. */
  Approvals.prototype.list = function () {
    return Array.from(this.waiting.values()).sort((a, b) => (a.at < b.at ? -1 : a.at > b.at ? 1 : 0));
  };

  /* Tokens as a person reads them: "unknown" when no server reported any of the requests'. */
  function tokensText(tokens, requests, unmeasured) {
    if (requests > 0 && unmeasured >= requests) return "unknown tokens";
    return tokens + " tokens";
  }

  const api = { SseParser, Family, Approvals, descendsFrom, depthOf, tokensText };
  if (typeof module !== "undefined" && module.exports) module.exports = api;
  else root.LoopdTree = api;
})(this);
