/* loopd's page: the sessions, the live tree of one family, and the calls waiting for a
   person (approve, or decline with a reason). Events are read with fetch
   (a stream of server-sent events), so the token goes in a header, never in a URL. Every text
   from the service is put in the page as text (textContent), never as HTML. */
(function () {
  "use strict";
  const { SseParser, Family, Approvals, tokensText } = window.LoopdTree;
  const Console = window.LoopdConsole;
  const TOKEN_KEY = "loopd-token";
  const $ = (id) => document.getElementById(id);

  const RECENT = 5000;
  let token = sessionStorage.getItem(TOKEN_KEY);
  let family = null;
  let recent = []; // the latest events, so a family picked now is drawn from its start
  let lastEventId = null;
  let renderQueued = false;
  let sessionsQueued = false;
  let approvalsQueued = false;
  let waitingForToken = null;
  const approvals = new Approvals();

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    if (token) h.Authorization = "Bearer " + token;
    return h;
  }

  /* Ask for the token once; resolves when the person has given it. */
  function askToken() {
    if (!waitingForToken) {
      waitingForToken = new Promise((resolve) => {
        const form = $("token-form");
        form.hidden = false;
        $("token").focus();
        form.onsubmit = (e) => {
          e.preventDefault();
          token = $("token").value.trim();
          sessionStorage.setItem(TOKEN_KEY, token);
          form.hidden = true;
          waitingForToken = null;
          resolve();
        };
      });
    }
    return waitingForToken;
  }

  async function api(path, init) {
    for (;;) {
      const opts = Object.assign({}, init || {});
      opts.headers = headers(opts.headers);
      const response = await fetch(path, opts);
      if (response.status !== 401) return response;
      await askToken();
    }
  }

  function text(tag, content, cls) {
    const el = document.createElement(tag);
    if (content !== undefined && content !== null) el.textContent = String(content);
    if (cls) el.className = cls;
    return el;
  }

  window.LoopdApi = api;

  function say(message) {
    $("message").textContent = message || "";
  }

  /* The sessions table: top-level sessions, each with its children below it. */
  async function loadSessions() {
    sessionsQueued = false;
    const response = await api("/v1/sessions");
    if (!response.ok) return;
    const rows = (await response.json()).sessions;
    const body = $("sessions").querySelector("tbody");
    body.replaceChildren();
    const byParent = new Map();
    for (const row of rows) {
      const key = row.parent || "";
      if (!byParent.has(key)) byParent.set(key, []);
      byParent.get(key).push(row);
    }
    const add = (row, depth) => {
      const tr = document.createElement("tr");
      if (depth) tr.className = "child";
      if (family && row.session === family.root) tr.classList.add("picked");
      tr.append(
        text("td", row.session), text("td", row.agent || ""),
        stateCell(row.state, row.background),
        text("td", row.turns ?? ""), text("td", row.messages ?? ""),
        text("td", (row.updated_at || "").replace(/^.*T/, "").replace(/\.\d+Z$/, "")),
      );
      tr.lastChild.title = row.updated_at || "";
      tr.onclick = () => pick(familyRoot(row, rows));
      body.append(tr);
      if (depth < 8) for (const child of byParent.get(row.session) || []) add(child, depth + 1);
    };
    for (const row of byParent.get("") || []) add(row, 0);
  }

  function stateCell(state, background) {
    const td = document.createElement("td");
    td.append(text("span", state || "", "state " + (state || "")));
    if (background) td.append(" ", text("span", "background", "badge background"));
    return td;
  }

  function familyRoot(row, rows) {
    const byId = new Map(rows.map((r) => [r.session, r]));
    let at = row;
    for (let i = 0; i < 64 && at.parent && byId.has(at.parent); i += 1) at = byId.get(at.parent);
    return at.parent || at.session;
  }

  function queueSessions() {
    if (!sessionsQueued) {
      sessionsQueued = true;
      setTimeout(() => loadSessions().catch(() => {}), 400);
    }
  }

  /* Pick a family: seed its tree from the store, then the live events keep it current. */
  async function pick(rootId) {
    family = new Family(rootId);
    Console.pick(rootId, family);
    for (const event of recent) {
      family.apply(event);
      Console.see(event);
    }
    $("family-name").textContent = rootId;
    say("");
    const picked = family;
    const seen = new Set();
    const load = async (id) => {
      if (seen.has(id) || seen.size > 500) return;
      seen.add(id);
      const response = await api("/v1/sessions/" + encodeURIComponent(id));
      if (!response.ok) return;
      const shown = await response.json();
      if (family !== picked) return;
      picked.seed(shown);
      await Promise.all((shown.children || []).map(load));
    };
    await load(rootId);
    queueRender();
    queueSessions();
  }

  function elapsed(node, now) {
    if (!node.started) return "";
    const end = node.ended ? Date.parse(node.ended) : now;
    const seconds = Math.max(0, (end - Date.parse(node.started)) / 1000);
    return seconds < 60 ? seconds.toFixed(1) + " s" : Math.floor(seconds / 60) + " min " +
      Math.round(seconds % 60) + " s";
  }

  function drawNode(node, now) {
    const li = document.createElement("li");
    const box = text("div", null, "node " + node.state);
    box.dataset.session = node.id;
    const head = text("div", null, "head");
    const id = text("a", node.id, "id");
    id.href = "#";
    id.onclick = (e) => {
      e.preventDefault();
      Console.show(node.id);
    };
    head.append(id, text("span", node.state, "state"));
    if (node.background) head.append(text("span", "background", "badge background"));
    const facts = [];
    if (node.agent) facts.push("agent " + node.agent);
    if (node.slot !== null && node.slot !== undefined) facts.push("slot " + node.slot);
    facts.push(tokensText(node.tokens, node.requests, node.unmeasured));
    const time = elapsed(node, now);
    if (time) facts.push(time);
    if (node.tool) facts.push("calling " + node.tool);
    if (node.waiting) facts.push("waiting for a person: " + node.waiting);
    head.append(text("span", facts.join(" · "), "facts"));
    box.append(head);
    if (node.reason) box.append(text("div", node.reason + (node.detail ? ": " + node.detail : ""), "detail"));
    if (node.output !== undefined && node.output !== null) {
      box.append(text("pre", JSON.stringify(node.output, null, 2), "output"));
    } else if (node.text) box.append(text("pre", node.text.slice(-4000)));
    li.append(box);
    if (node.children.length) {
      const ul = document.createElement("ul");
      for (const child of node.children) ul.append(drawNode(child, now));
      li.append(ul);
    }
    return li;
  }

  function render() {
    renderQueued = false;
    const tree = $("tree");
    if (!family) {
      tree.replaceChildren();
      return;
    }
    const data = family.toJSON();
    const ul = text("ul", null, "tree");
    ul.append(drawNode(data, Date.now()));
    tree.replaceChildren(ul);
    $("cancel").hidden = data.state !== "running" && data.state !== "waiting";
    Console.render();
  }

  function queueRender() {
    if (!renderQueued) {
      renderQueued = true;
      requestAnimationFrame(render);
    }
  }

  /* The waiting calls, oldest first: session, call, tool, arguments (as the model wrote them),
     and a warning when the session had read untrusted data. */
  function drawApprovals() {
    const list = approvals.list();
    const ul = $("approvals");
    const kept = new Map(Array.from(ul.children).map((li) => [li.dataset.key, li]));
    ul.replaceChildren(...list.map((request) => {
      const key = Approvals.key(request.session, request.call_id);
      return kept.get(key) || drawApproval(request, key);
    }));
    $("approvals-count").textContent = list.length ? "(" + list.length + ")" : "";
    $("approvals-panel").hidden = list.length === 0;
  }

  function drawApproval(request, key) {
    const li = text("li", null, "approval" + (request.untrusted ? " untrusted" : ""));
    li.dataset.key = key;
    li.dataset.session = request.session;
    li.dataset.callId = String(request.call_id);
    const head = text("div", null, "head");
    head.append(
      text("span", request.session, "id"),
      text("span", "call " + request.call_id + ": " + request.tool, "tool"),
      text("span", "", "agent"),
      text("span", "", "facts waited"),
    );
    head.querySelector(".waited").dataset.at = request.at || "";
    li.append(head);
    li.append(text("div", "", "description"));
    li.append(text("blockquote", "", "said"));
    li.append(text("div", request.untrusted ? "untrusted: this session read untrusted data, " +
      "so these arguments may come from injected text" : "", request.untrusted ? "warning" : "trusted"));
    Console.context(request, li);
    let shown = request.arguments;
    try {
      shown = JSON.stringify(JSON.parse(request.arguments), null, 2);
    } catch (error) {
      // not JSON: shown as the model wrote it
    }
    li.append(text("pre", shown, "arguments"));
    const actions = text("div", null, "actions");
    const approve = text("button", "Approve", "approve");
    const reason = text("input", null, "reason");
    reason.placeholder = "a note (kept) or why not (the model reads it)";
    const decline = text("button", "Decline", "decline");
    const said = text("span", "", "hint outcome");
    approve.type = decline.type = "button";
    approve.onclick = () => {
      const note = reason.value.trim();
      decide(request, note ? { approve: true, note: note } : { approve: true }, li, said);
    };
    decline.onclick = () => {
      if (!reason.value.trim()) {
        reason.focus();
        said.textContent = "a decline needs a reason";
        return;
      }
      decide(request, { approve: false, reason: reason.value.trim() }, li, said);
    };
    reason.onkeydown = (e) => {
      if (e.key === "Enter") decline.onclick();
    };
    actions.append(approve, decline, reason, said);
    li.append(actions);
    return li;
  }

  async function decide(request, body, li, said) {
    for (const button of li.querySelectorAll("button")) button.disabled = true;
    const path = "/v1/approvals/" + encodeURIComponent(request.session) + "/" + request.call_id;
    try {
      const response = await api(path, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      });
      const answer = await response.json();
      if (response.ok || response.status === 409) {
        // Settled (by this page or, for a 409, by someone else): it waits no more.
        approvals.apply({ type: "ApprovalSettled", session: request.session,
          call_id: request.call_id });
        drawApprovals();
        say(response.ok ? "call " + request.call_id + " of " + request.session + " " +
          (answer.approved ? "approved" : "declined") : answer.detail);
        return;
      }
      said.textContent = answer.error || "HTTP " + response.status;
    } catch (error) {
      said.textContent = error.message;
    }
    for (const button of li.querySelectorAll("button")) button.disabled = false;
  }

  async function loadApprovals() {
    approvalsQueued = false;
    const before = Array.from(approvals.waiting.keys());
    const response = await api("/v1/approvals");
    if (!response.ok) return;
    approvals.load((await response.json()).approvals, before);
    drawApprovals();
  }

  function queueApprovals() {
    if (!approvalsQueued) {
      approvalsQueued = true;
      setTimeout(() => loadApprovals().catch(() => {}), 300);
    }
  }

  function link(state, what) {
    const el = $("link");
    el.className = "link " + state;
    el.textContent = what;
  }

  /* The event stream, read with fetch; reconnects with Last-Event-ID after a drop. */
  async function streamEvents() {
    for (let wait = 500; ; wait = Math.min(wait * 2, 10000)) {
      try {
        const extra = lastEventId === null ? {} : { "Last-Event-ID": lastEventId };
        const response = await api("/v1/events", { headers: extra });
        if (!response.ok || !response.body) throw new Error("HTTP " + response.status);
        link("live", "live");
        wait = 500;
        loadApprovals().catch(() => {}); // what waits now, whatever the stream missed
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        const parser = new SseParser();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          for (const frame of parser.feed(decoder.decode(value, { stream: true }))) handle(frame);
        }
      } catch (error) {
        link("down", "reconnecting (" + error.message + ")");
      }
      await new Promise((resolve) => setTimeout(resolve, wait));
    }
  }

  function handle(frame) {
    if (frame.event === "dropped") {
      link("down", "fell behind; catching up");
      return;
    }
    if (frame.event === "gap") {
      if (family) pick(family.root);
      return;
    }
    if (frame.id !== null) lastEventId = frame.id;
    let event;
    try {
      event = JSON.parse(frame.data);
    } catch (error) {
      return;
    }
    recent.push(event);
    if (recent.length > RECENT) recent = recent.slice(-RECENT / 2);
    if (event.type === "TurnStarted" || event.type === "TurnEnded") queueSessions();
    if (approvals.apply(event)) drawApprovals();
    // A cancel drops a waiting call without an ApprovalSettled: ask what still waits.
    if (event.type === "TurnEnded" && approvals.waits(event.session)) queueApprovals();
    Console.event(event);
    if (family && family.apply(event)) {
      queueRender();
      if (event.type === "TurnEnded") reseed(family, event.session);
    }
  }

  /* A node's stored facts (its agent, say), once its turn has ended and is stored. */
  async function reseed(picked, session) {
    const response = await api("/v1/sessions/" + encodeURIComponent(session));
    if (!response.ok || family !== picked) return;
    picked.seed(await response.json());
    queueRender();
  }

  $("cancel").onclick = async () => {
    if (!family) return;
    const response = await api("/v1/sessions/" + encodeURIComponent(family.root) + "/cancel", {
      method: "POST",
    });
    const answer = await response.json();
    say(response.ok ? "cancelled: " + (answer.cancelled.join(", ") || "nothing was running")
      : answer.error);
  };

  $("turn-form").onsubmit = async (e) => {
    e.preventDefault();
    const session = $("turn-session").value.trim();
    const response = await api("/v1/sessions/" + encodeURIComponent(session) + "/turns", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ text: $("turn-text").value, wait: false }),
    });
    const answer = await response.json();
    if (!response.ok) {
      say(answer.error);
      return;
    }
    $("turn-text").value = "";
    await pick(session);
  };

  setInterval(() => {
    Console.tick();
    if (family && family.toJSON().state === "running") queueRender(); // elapsed times tick
  }, 1000);

  loadSessions().catch(() => {});
  streamEvents();
})();
