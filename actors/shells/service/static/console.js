/* loopd's page, the views of one family beyond its tree: a session's transcript (turn by turn,
   each tool call with its arguments and result, decisions and untrusted results marked), the
   family's Timeline (one row per session on a shared time axis, live from the events), and
   the context of a call that waits for a person. Every text from the service is put in the
   page as text (textContent), never as HTML. */
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const api = (path) => window.LoopdApi(path);
  const { tokensText } = window.LoopdTree;

  let root = null;
  let family = null;
  let shown = null; // the session whose transcript is shown
  let view = "tree";
  let loadQueued = false;
  const rows = new Map(); // the timeline: session -> {turns, marks, waits}

  function text(tag, content, cls) {
    const el = document.createElement(tag);
    if (content !== undefined && content !== null) el.textContent = String(content);
    if (cls) el.className = cls;
    return el;
  }

  function pretty(raw) {
    try {
      return JSON.stringify(JSON.parse(raw), null, 2);
    } catch (error) {
      return raw; // not JSON: as the model wrote it
    }
  }

  function usageText(usage) {
    if (!usage) return "";
    const tokens = (usage.prompt_tokens || 0) + (usage.completion_tokens || 0);
    const requests = usage.requests || 0;
    const line = tokensText(tokens, requests, usage.unmeasured_requests || 0);
    return line + ", " + requests + " request" + (requests === 1 ? "" : "s");
  }

  function decisionText(decision) {
    if (decision.approved) return "approved by a person" + (decision.note ? ": " + decision.note : "");
    return "declined: " + (decision.reason || "");
  }

  /* ---- views ---- */

  function setView(name) {
    view = name;
    for (const button of document.querySelectorAll("#views button")) {
      button.classList.toggle("on", button.dataset.view === name);
    }
    for (const name2 of ["tree", "transcript", "timeline"]) $(name2).hidden = name2 !== name;
    render();
  }

  /* ---- the transcript ---- */

  function show(session) {
    shown = session;
    setView("transcript");
    load();
  }

  function queueLoad() {
    if (!loadQueued) {
      loadQueued = true;
      setTimeout(() => load().catch(() => {}), 250);
    }
  }

  async function load() {
    loadQueued = false;
    if (!shown) return;
    const session = shown;
    const response = await api("/v1/sessions/" + encodeURIComponent(session));
    if (!response.ok || shown !== session) return;
    drawTranscript(await response.json());
  }

  function drawTranscript(data) {
    const box = $("transcript");
    const head = text("div", null, "transcript-head");
    head.append(text("span", data.session, "id"), text("span", data.state, "state " + data.state));
    if (data.background) head.append(text("span", "background", "badge background"));
    const facts = ["agent " + data.agent];
    if (data.parent) facts.push("child of " + data.parent);
    if (data.untrusted) facts.push("read untrusted data");
    facts.push("usage " + usageText(data.usage));
    head.append(text("span", facts.join(" · "), "facts"));
    const turns = [];
    const results = new Map();
    for (const item of data.history || []) {
      const m = item.message;
      if (m.role === "tool") results.set(m.tool_call_id, m);
    }
    let turn = null;
    for (const item of data.history || []) {
      const m = item.message;
      const isTurn = m.role === "user" && !(m.name === "subagent" && turn && turn.open) &&
        m.content !== "Answer by calling final_answer." &&
        !(m.content || "").startsWith("Summary of the earlier conversation:");
      if (isTurn || !turn) {
        turn = { el: text("section", null, "turn"), open: false };
        turns.push(turn);
        turn.el.append(text("h3", "turn " + turns.length));
      }
      if (m.role === "user") {
        const who = m.name ? m.name : "user";
        turn.el.append(labelled(who, m.content, "user"));
      } else if (m.role === "assistant") {
        if (m.content) turn.el.append(labelled("assistant", m.content, "assistant"));
        for (const call of m.tool_calls || []) turn.el.append(drawCall(call, results.get(call.id), data));
        turn.open = (m.tool_calls || []).length > 0;
      }
    }
    const entries = data.turn_usage || [];
    turns.forEach((t, i) => {
      const entry = entries[i];
      if (entry && entry.output !== null && entry.output !== undefined) {
        const out = text("div", null, "msg output");
        out.append(text("span", "output", "who"), text("pre", JSON.stringify(entry.output, null, 2)));
        t.el.append(out);
      }
      const last = i === turns.length - 1;
      const outcome = last ? data.state : "completed";
      const foot = text("div", null, "turn-foot");
      foot.append(text("span", outcome, "state " + outcome));
      if (entry) foot.append(text("span", "usage " + usageText(entry.usage), "facts usage"));
      t.el.append(foot);
    });
    box.replaceChildren(head, ...turns.map((t) => t.el));
  }

  function labelled(who, content, cls) {
    const el = text("div", null, "msg " + cls);
    el.append(text("span", who, "who"), text("div", content || "", "body"));
    return el;
  }

  function drawCall(call, result, data) {
    const el = text("div", null, "call");
    const head = text("div", null, "call-head");
    head.append(text("span", "#" + call.id, "call-id"), text("span", call.name, "tool-name"));
    const child = "sub-" + data.session + "-" + call.id;
    const spawns = call.name === "subagent" || (call.name === "call_tool" && /"subagent"/.test(call.arguments));
    if (spawns || (data.children || []).includes(child)) {
      const link = text("a", "→ " + child, "child-link");
      link.href = "#";
      link.onclick = (e) => {
        e.preventDefault();
        show(child);
      };
      head.append(link);
    }
    el.append(head, text("pre", pretty(call.arguments), "arguments"));
    if (!result) {
      el.append(text("div", "no result yet", "result pending"));
      return el;
    }
    if (result.decision) {
      el.append(text("div", decisionText(result.decision), "decision " +
        (result.decision.approved ? "approved" : "declined")));
    }
    const denied = (result.content || "").startsWith("Denied:");
    const failed = / failed$/.test((result.content || "").split("\n")[0]) || /^Error/.test(result.content || "");
    let cls = "result";
    if (denied) cls += " denied";
    else if (failed) cls += " error";
    if (result.untrusted) cls += " untrusted";
    const box = text("div", null, cls);
    const label = denied ? "denied" : failed ? "error" : "result";
    box.append(text("span", label + (result.untrusted ? " · untrusted" : ""), "who"));
    box.append(text("pre", result.content || ""));
    el.append(box);
    return el;
  }

  /* ---- the timeline ---- */

  function row(session) {
    let r = rows.get(session);
    if (!r) {
      r = { turns: [], marks: [], waits: [] };
      rows.set(session, r);
    }
    return r;
  }

  function ms(at) {
    return Date.parse(at);
  }

  function see(event) {
    if (!family || typeof event.session !== "string" || !family.has(event.session)) return false;
    const r = row(event.session);
    const at = ms(event.at);
    const open = r.turns[r.turns.length - 1];
    switch (event.type) {
      case "TurnStarted":
        if (!open || open.end !== null) r.turns.push({ start: at, end: null, state: "running" });
        break;
      case "TurnEnded":
        if (open && open.end === null) {
          open.end = at;
          open.state = event.completed ? "completed" : event.reason === "cancelled" ? "cancelled" : "failed";
        }
        for (const w of r.waits) if (w.end === null) w.end = at;
        break;
      case "ModelRequestSent":
        r.marks.push({ kind: "model", start: at, end: null, label: "model request " + event.step });
        break;
      case "ModelAnswered": {
        const m = r.marks.filter((x) => x.kind === "model" && x.end === null).pop();
        if (m) m.end = at;
        break;
      }
      case "ToolCallStarted":
        r.marks.push({ kind: "tool", start: at, end: null, id: event.call_id, label: event.name });
        break;
      case "ToolCallFinished": {
        const m = r.marks.find((x) => x.kind === "tool" && x.id === event.call_id && x.end === null);
        if (m) m.end = at;
        else r.marks.push({ kind: "tool", start: at, end: at, id: event.call_id, label: event.name });
        break;
      }
      case "ApprovalRequested":
        r.waits.push({ start: at, end: null, id: event.call_id, label: event.tool });
        break;
      case "ApprovalSettled": {
        const w = r.waits.find((x) => x.id === event.call_id && x.end === null);
        if (w) w.end = at;
        break;
      }
      case "SubagentStarted":
        row(event.child);
        break;
      default:
        return false;
    }
    return true;
  }

  function drawTimeline() {
    const box = $("timeline");
    const ids = family ? Array.from(family.nodes.keys()) : [];
    for (const id of ids) row(id);
    const now = Date.now();
    let first = Infinity;
    let last = -Infinity;
    for (const id of ids) {
      const r = rows.get(id);
      for (const t of r.turns) {
        first = Math.min(first, t.start);
        last = Math.max(last, t.end === null ? now : t.end);
      }
    }
    if (!isFinite(first)) {
      box.replaceChildren(text("p", "No turn of this family has run since the page opened.", "hint"));
      return;
    }
    const span = Math.max(last - first, 1);
    const x = (t) => (100 * (t - first)) / span + "%";
    const w = (a, b) => Math.max((100 * (b - a)) / span, 0.3) + "%";
    const axis = text("div", null, "axis");
    axis.append(text("span", "0 s"), text("span", ((last - first) / 1000).toFixed(1) + " s"));
    const list = text("div", null, "rows");
    const nodes = family.toJSON();
    const order = [];
    const walk = (n, depth) => {
      order.push([n, depth]);
      for (const c of n.children) walk(c, depth + 1);
    };
    walk(nodes, 0);
    for (const [n, depth] of order) {
      const r = rows.get(n.id);
      const line = text("div", null, "row " + n.state);
      line.dataset.session = n.id;
      const label = text("div", null, "label");
      label.style.paddingLeft = Math.min(depth, 8) * 0.8 + "em";
      label.append(text("span", n.id, "id"), text("span", n.state, "state " + n.state));
      label.title = n.id + " · " + n.state;
      const lane = text("div", null, "lane");
      for (const t of r.turns) {
        const bar = text("div", null, "bar " + t.state);
        bar.style.left = x(t.start);
        bar.style.width = w(t.start, t.end === null ? now : t.end);
        bar.title = n.id + ": turn " + t.state;
        lane.append(bar);
      }
      for (const wt of r.waits) {
        const wait = text("div", null, "wait");
        wait.style.left = x(wt.start);
        wait.style.width = w(wt.start, wt.end === null ? now : wt.end);
        wait.title = "waiting for a person: " + wt.label;
        lane.append(wait);
      }
      for (const m of r.marks) {
        const mark = text("div", null, "mark " + m.kind);
        mark.style.left = x(m.start);
        mark.style.width = w(m.start, m.end === null ? now : m.end);
        mark.title = m.label;
        lane.append(mark);
      }
      line.append(label, lane);
      label.onclick = () => show(n.id);
      list.append(line);
    }
    const legend = text("div", null, "legend");
    for (const [cls, what] of [["bar running", "turn"], ["mark model", "model request"],
      ["mark tool", "tool call"], ["wait", "waiting for a person"]]) {
      const key = text("span", null, "key");
      key.append(text("i", null, cls), document.createTextNode(what));
      legend.append(key);
    }
    box.replaceChildren(legend, axis, list);
  }

  /* ---- an approval's context ---- */

  async function context(request, li) {
    const response = await api("/v1/sessions/" + encodeURIComponent(request.session));
    if (!response.ok) return;
    const data = await response.json();
    li.querySelector(".agent").textContent = "agent " + data.agent;
    let tool = request.tool;
    const spec = (data.tools || []).find((t) => t.name === tool);
    li.querySelector(".description").textContent = spec ? tool + ": " + spec.description.split("\n")[0]
      : tool + " (no description)";
    const transcript = data.transcript || [];
    const asked = transcript.find((m) => (m.tool_calls || []).some((c) => c.id === request.call_id));
    li.querySelector(".said").textContent = asked && asked.content ? asked.content
      : "(the model said nothing with this call)";
    if (request.untrusted) {
      const names = new Map();
      for (const m of transcript) for (const c of m.tool_calls || []) names.set(c.id, c.name);
      const sources = transcript.filter((m) => m.role === "tool" && m.untrusted)
        .map((m) => "call " + m.tool_call_id + " (" + (names.get(m.tool_call_id) || "?") + ")");
      const why = sources.length ? "it read untrusted results: " + sources.join(", ")
        : "it read untrusted data earlier (a report, or a result before this page)";
      li.querySelector(".warning").textContent = "untrusted: these arguments may come from " +
        "injected text; " + why;
    } else {
      li.querySelector(".trusted").textContent = "trusted: this session has read no untrusted data";
    }
  }

  function tick() {
    for (const el of document.querySelectorAll(".approval .waited")) {
      const seconds = Math.max(0, (Date.now() - Date.parse(el.dataset.at)) / 1000);
      el.textContent = "waiting " + (seconds < 60 ? Math.floor(seconds) + " s"
        : Math.floor(seconds / 60) + " min " + Math.floor(seconds % 60) + " s");
    }
    if (view === "timeline") drawTimeline();
  }

  function render() {
    if (view === "timeline") drawTimeline();
  }

  function event(e) {
    const changed = see(e);
    if (shown && e.session === shown && ["TurnEnded", "ToolCallFinished", "ApprovalSettled",
      "ApprovalRequested", "ModelAnswered", "TurnStarted"].includes(e.type)) queueLoad();
    if (changed && view === "timeline") drawTimeline();
  }

  function pick(rootId, picked) {
    root = rootId;
    family = picked;
    rows.clear();
    shown = rootId;
    if (view === "transcript") load();
  }

  for (const button of document.querySelectorAll("#views button")) {
    button.onclick = () => {
      setView(button.dataset.view);
      if (button.dataset.view === "transcript") load();
    };
  }

  window.LoopdConsole = { pick, show, event, render, tick, context, see, root: () => root };
})();
