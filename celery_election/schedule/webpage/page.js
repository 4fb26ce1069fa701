// The schedule page: polls api/state and api/entries every second and patches the DOM in
// place (rows keyed by name), so 1,000 entries stay usable: search, sort and pages run here.
"use strict";
(() => {
  const $ = (sel, root = document) => root.querySelector(sel);
  const csrf = $("meta[name=csrf-token]").content;
  const POLL_MS = 1000;
  const S = {
    entries: [], etag: null, offset: 0, canAct: $("meta[name=election-mode]").content === "act",
    sort: { key: "name", dir: 1 }, query: "", state: "", page: 0, size: 50,
    rows: new Map(), leaders: new Map(), detail: null, lastOk: 0,
  };
  // What the browser test reads: when the first table was on screen, and how long it took.
  const M = (window.electionPage = {
    firstTableRenderMs: null, firstTableRenderDurationMs: null, entriesLoadMs: null,
    renders: 0, polls: 0, entries: 0,
  });

  // -- the token ---------------------------------------------------------------------------
  const KEY = "celery-election-token";
  if (location.hash.startsWith("#token=")) {
    sessionStorage.setItem(KEY, decodeURIComponent(location.hash.slice(7)));
    history.replaceState(null, "", location.pathname + location.search);
  }
  const token = () => sessionStorage.getItem(KEY) || "";

  // -- helpers -----------------------------------------------------------------------------
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const c of children) node.append(c);
    return node;
  }
  function set(node, text, title) {
    text = text == null ? "" : String(text);
    if (node.textContent !== text) node.textContent = text;
    if (title !== undefined && node.title !== title) node.title = title;
  }
  function setClass(node, cls) { if (node.className !== cls) node.className = cls; }
  const now = () => Date.now() + S.offset;  // the database's clock, as the server said it
  function age(seconds) {
    if (seconds == null || !isFinite(seconds)) return "";
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  }
  const when = (ms) => (ms == null ? "" : new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC");
  const ago = (ms) => (ms == null ? "" : `${age((now() - ms) / 1000)} ago`);
  function message(text, error = false) {
    const box = $("#message");
    box.textContent = text;
    box.className = error ? "error" : "";
    box.hidden = false;
    clearTimeout(message.timer);
    message.timer = setTimeout(() => { box.hidden = true; }, error ? 8000 : 4000);
  }
  async function getJSON(path, headers = {}) {
    const auth = token() ? { Authorization: `Bearer ${token()}` } : {};
    return fetch(path, { headers: { ...auth, ...headers }, cache: "no-store" });
  }

  // -- elections ---------------------------------------------------------------------------
  // the keys singleton tasks hold (null: the tables predate key holds: no section)
  const KEYS_SHOWN = 200;
  function renderKeys(st) {
    $("#keys-section").hidden = st.keys == null;
    if (st.keys == null) return;
    set($("#keys-ns"), `(namespace ${st.keys_namespace}; release: celery election release KEY)`);
    const rows = st.keys.slice(0, KEYS_SHOWN).map((k) => el("tr", { "data-key": k.key },
      el("td", { class: "key" }, k.key),
      el("td", { class: "holder" }, k.holder ?? "?"),
      el("td", { class: "since", title: when(k.since_ms) }, k.held_for != null ? `${age(k.held_for)} ago` : ""),
      el("td", { class: "term" }, String(k.term)),
      el("td", { class: "left", title: k.liveness != null ? `frees about ${k.liveness}s after its holder dies` : "" },
        `${k.expires_in.toFixed(1)}s`)));
    if (st.keys.length > KEYS_SHOWN)
      rows.push(el("tr", {}, el("td", { colSpan: 5, class: "muted" }, `and ${st.keys.length - KEYS_SHOWN} more`)));
    $("#keys tbody").replaceChildren(...rows);
    $("#no-keys").hidden = st.keys.length > 0;
  }
  function renderState(st) {
    if (st.now_ms != null) S.offset = st.now_ms - Date.now();
    set($("#database"), st.database);
    set($("#schedule-ns"), `(${st.schedule_namespace})`);
    const mode = $("#mode");
    S.canAct = st.can_act;
    set(mode, st.can_act ? "actions allowed with the token" : "read-only");
    setClass(mode, `badge ${st.can_act ? "ok" : "warn"}`);
    $("#token-form").hidden = !st.can_act || st.auth !== "token";
    const body = $("#leaders tbody");
    const seen = new Set();
    for (const ns of st.namespaces) {
      seen.add(ns.namespace);
      let tr = S.leaders.get(ns.namespace);
      if (!tr) {
        tr = el("tr", { "data-namespace": ns.namespace });
        for (const c of ["ns", "leader", "hostpid", "term", "led", "lease", "liveness", "candidates"])
          tr.append(el("td", { class: c }));
        S.leaders.set(ns.namespace, tr);
      }
      body.append(tr);  // keeps the order of the answer
      const td = (c) => $(`td.${c}`, tr);
      set(td("ns"), ns.namespace);
      set(td("leader"), ns.leader || "no leader");
      setClass(td("leader"), ns.leader ? "leader" : "leader leader-none");
      set(td("hostpid"), ns.leader ? `${ns.host ?? "?"} / ${ns.pid ?? "?"}` : "");
      // a term is shown as the time it began (the raw fencing number on hover)
      set(td("term"), ns.term == null ? "" : ns.acquired_at_ms != null ? `began ${when(ns.acquired_at_ms)}` : "not held",
        ns.term == null ? "" : `term ${ns.term}`);
      if (tr.dataset.term !== String(ns.term ?? "")) tr.dataset.term = String(ns.term ?? "");
      set(td("led"), ns.led_for != null ? age(ns.led_for) : "", when(ns.acquired_at_ms));
      set(td("lease"), ns.expires_in != null ? `${ns.expires_in.toFixed(1)}s` : "");
      set(td("liveness"), ns.liveness != null ? `on (${ns.liveness}s)` : ns.leader ? "off (lease only)" : "");
      set(td("candidates"), ns.candidates.map((c) =>
        `${c.leading ? "\u2605 " : ""}${c.host}/${c.pid} (${age(c.heartbeat_age)})`).join(", "),
        ns.candidates.map((c) => c.id).join("\n"));
    }
    for (const [name, tr] of S.leaders) if (!seen.has(name)) { tr.remove(); S.leaders.delete(name); }
    $("#no-elections").hidden = st.namespaces.length > 0;
    renderKeys(st);
    const tlist = $("#transitions");
    tlist.replaceChildren(...st.transitions.slice(0, 30).map((t) => el("li", {},
      el("span", { class: "muted" }, `${when(t.at_ms)} `), `${t.namespace}: `,
      t.previous_term == null && t.previous_leader == null
        ? `seen led by ${t.leader || "nobody"}`
        : `${t.previous_leader || "nobody"} \u2192 ${t.leader || "nobody"}`,
      el("span", { class: "muted", title: `term ${t.previous_term ?? "-"} \u2192 ${t.term ?? "-"}` },
        t.previous_term == null ? " (term on hover)" : " (new term)"))));
    $("#actions").replaceChildren(...st.actions.map((a) => el("li", {},
      el("span", { class: "muted" }, `${when(a.at_ms)} `), `${a.action} ${a.name} by ${a.actor}`)));
    if (st.error) message(`database: ${st.error}`, true);
  }

  // -- entries -----------------------------------------------------------------------------
  function sortValue(e, key) {
    if (key === "outcome") return e.last ? e.last.outcome || e.last.kind : null;
    return e[key];
  }
  function visible() {
    const q = S.query.toLowerCase();
    let list = S.entries;
    if (q) list = list.filter((e) => e._text.includes(q));
    if (S.state) list = list.filter((e) => e.state === S.state);
    const { key, dir } = S.sort;
    return list.slice().sort((a, b) => {
      const x = sortValue(a, key), y = sortValue(b, key);
      if (x == null && y == null) return a.name < b.name ? -1 : 1;
      if (x == null) return 1;  // empty last, either way
      if (y == null) return -1;
      if (x < y) return -dir;
      if (x > y) return dir;
      return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
    });
  }
  const CELLS = ["name", "task", "schedule", "tz", "due", "last", "outcome", "state", "policies", "actions"];
  function makeRow(name) {
    const tr = el("tr", { "data-entry": name });
    for (const c of CELLS) tr.append(el("td", { class: c }));
    $("td.name", tr).append(el("button", { type: "button", class: "link", "data-action": "detail", textContent: name }));
    $("td.actions", tr).append(
      el("button", { type: "button", class: "pause-toggle", "data-action": "pause" }, "Pause"),
      " ", el("button", { type: "button", "data-action": "run_now" }, "Run now"),
      " ", el("button", { type: "button", class: "enable-toggle", "data-action": "disable" }, "Disable"));
    return tr;
  }
  function policiesText(p) {
    const defaults = { catch_up: "latest", catch_up_max: 10, grace: null, overlap: "allow", overlap_timeout: 3600 };
    return Object.entries(p).filter(([k, v]) => defaults[k] !== v).map(([k, v]) => `${k}=${v}`).join(" ");
  }
  function dueText(e) {
    if (!e.enabled) return ["\u2014", ""];
    if (e.paused) return ["paused", when(e.next_due_ms)];
    // past due + grace, not sent or not finished: what /metrics reports (the alert's series)
    if (e.overdue > 0) return [`overdue ${age(e.overdue)}`, "not sent or not finished within its grace"];
    // claimed, and the broker has not taken it yet: the leading beat sends it until it does
    if (e.pending_since_ms != null) return [`unsent for ${age((now() - e.pending_since_ms) / 1000)}`, `claimed ${when(e.pending_since_ms)}; sent again until the broker takes it`];
    if (e.next_due_ms == null) return ["never", ""];
    const left = (e.next_due_ms - Date.now()) / 1000;  // computed with the server's host clock
    return [left <= 0.5 ? "due now" : `in ${age(left)}`, when(e.next_due_ms)];
  }
  function updateRow(tr, e) {
    const td = (c) => tr.children[CELLS.indexOf(c)];
    set(td("task"), e.task);
    // a crontab's zone has its own column
    const words = e.schedule.startsWith("cron ") ? e.schedule.replace(/ \([^)]*\)$/, "") : e.schedule;
    set(td("schedule"), words + (e.kind === "static" ? " \u00b7 static" : ""));
    set(td("tz"), e.tz ?? "\u2014");
    const [due, dueTitle] = dueText(e);
    set(td("due"), due, dueTitle);
    setClass(td("due"), e.overdue > 0 ? "due overdue" : "due");
    tr.classList.toggle("overdue", e.overdue > 0);
    set(td("last"), e.last_run_ms ? ago(e.last_run_ms) : "never", when(e.last_run_ms));
    const out = e.last ? (e.last.outcome || e.last.kind) : "";
    const dur = e.last && e.last.duration != null ? ` ${e.last.duration.toFixed(2)}s` : "";
    set(td("outcome"), out + dur, e.last ? `${e.last.kind} \u00b7 term ${e.last.term} \u00b7 task ${e.last.task_id ?? "-"}` : "");
    setClass(td("outcome"), `outcome outcome-${out}`);
    set(td("state"), e.state + (e.run_now_pending ? " +run now" : ""));
    setClass(td("state"), `state state-${e.state}`);
    set(td("policies"), policiesText(e.policies));
    const pause = $(".pause-toggle", tr);
    pause.setAttribute("data-action", e.paused ? "resume" : "pause");
    set(pause, e.paused ? "Resume" : "Pause");
    const enable = $(".enable-toggle", tr);
    enable.setAttribute("data-action", e.enabled ? "disable" : "enable");
    set(enable, e.enabled ? "Disable" : "Enable");
    td("actions").hidden = !S.canAct;
  }
  function renderTable() {
    const started = performance.now();
    const list = visible();
    const pages = Math.max(1, Math.ceil(list.length / S.size));
    S.page = Math.min(S.page, pages - 1);
    const shown = list.slice(S.page * S.size, (S.page + 1) * S.size);
    const body = $("#entries tbody");
    const keep = new Set();
    shown.forEach((e, i) => {
      let tr = S.rows.get(e.name);
      if (!tr) { tr = makeRow(e.name); S.rows.set(e.name, tr); }
      keep.add(e.name);
      updateRow(tr, e);
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
    for (const [name, tr] of S.rows) if (!keep.has(name)) { tr.remove(); S.rows.delete(name); }
    set($("#count"), `${list.length} of ${S.entries.length} entries`);
    set($("#page-info"), list.length ? `${S.page * S.size + 1}\u2013${S.page * S.size + shown.length} of ${list.length}` : "0");
    $("#prev").disabled = S.page === 0;
    $("#next").disabled = S.page >= pages - 1;
    for (const th of document.querySelectorAll("#entries th[data-sort]")) {
      th.classList.toggle("asc", th.dataset.sort === S.sort.key && S.sort.dir === 1);
      th.classList.toggle("desc", th.dataset.sort === S.sort.key && S.sort.dir === -1);
    }
    M.renders += 1;
    if (M.firstTableRenderMs == null && S.entries.length) {
      M.firstTableRenderDurationMs = performance.now() - started;
      M.firstTableRenderMs = performance.now();
      M.entries = S.entries.length;
    }
  }

  // -- the timeline ------------------------------------------------------------------------
  // Who led when (one band per term, the gaps between, exact) and each entry's runs as marks,
  // over a window, drawn as SVG: one <path> per entry and kind of mark (not one node per
  // run), so a day of a thousand entries' runs is a few thousand nodes. The server sends one
  // mark per entry and pixel column, the worst of its runs (api/timeline); hover and click
  // find the mark under the pointer by a binary search of its entry's row and ask api/mark
  // for the runs behind it.
  const SVGNS = "http://www.w3.org/2000/svg";
  const T = (window.electionTimeline = {
    renders: 0, lastRenderMs: null, firstRenderMs: null, firstRenderDurationMs: null,
    bands: [], gaps: [], marks: {}, flagged: [], runs: 0, columns: 0, entries: 0, loadMs: null,
  });
  const TL = {
    data: null, windowMs: 3600000, rows: [], x: null, terms: new Map(), polls: 0,
    details: new Map(), hover: null, hoverLines: null, pinned: null,
  };
  function svg(tag, attrs = {}, text) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text != null) node.textContent = text;
    return node;
  }
  function words(seconds) {
    // a duration in words: "0.42 seconds", "3 minutes 5 seconds", "2 hours 4 minutes"
    if (seconds == null || !isFinite(seconds)) return "";
    const s = Math.abs(seconds);
    const unit = (n, w) => `${n} ${w}${n === 1 ? "" : "s"}`;
    if (s < 60) return `${s < 10 ? s.toFixed(s < 1 ? 2 : 1) : Math.round(s)} seconds`;
    const parts = [[86400, "day"], [3600, "hour"], [60, "minute"], [1, "second"]];
    let rest = Math.round(s);
    const out = [];
    for (const [size, w] of parts) {
      if (rest >= size && out.length < 2) { out.push(unit(Math.floor(rest / size), w)); rest %= size; }
      else if (out.length) break;
    }
    return out.join(" ");
  }
  const clock = (ms) => (ms == null ? "" : new Date(ms).toISOString().slice(11, 19));
  function termText(namespace, term) {
    // a term as the time it began (the raw fencing number is for hover)
    const t = TL.terms.get(`${namespace}\u0000${term}`) || TL.terms.get(`*\u0000${term}`);
    return t ? `term began ${when(t.started_ms)}` : `term ${term}`;
  }
  function niceStep(spanMs, px) {
    const steps = [1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5, 36e5, 72e5,
      108e5, 216e5, 432e5, 864e5, 1728e5];
    for (const s of steps) if ((s / spanMs) * px >= 90) return s;
    return steps[steps.length - 1];
  }
  function timelineWidth() {
    // the rows' box without its scroll bar (a gutter kept for it), so no mark hides under it
    return Math.max(600, $("#tl-scroll").clientWidth || $("#tl-head").clientWidth || 900);
  }
  function renderTimeline() {
    const d = TL.data;
    if (!d) return;
    const started = performance.now();
    const head = $("#tl-head"), body = $("#tl-body");
    const W = timelineWidth(), L = 190, R = 8, P = W - L - R;
    const from = d.from_ms, to = d.to_ms, span = Math.max(1, to - from);
    const x = (ms) => L + ((Math.min(Math.max(ms, from), to) - from) / span) * P;
    TL.x = x;
    const LANE = 20, ROW = 14, AXIS = 20;
    // leadership: one lane per election namespace
    const byNs = new Map();
    TL.terms = new Map();
    for (const t of d.terms) {
      if (!byNs.has(t.namespace)) byNs.set(t.namespace, []);
      byNs.get(t.namespace).push(t);
      TL.terms.set(`${t.namespace}\u0000${t.term}`, t);
      TL.terms.set(`*\u0000${t.term}`, t);
    }
    const lanes = [...byNs.keys()].sort();
    const H = AXIS + Math.max(1, lanes.length) * LANE + 4;
    const top = svg("svg", { width: W, height: H, class: "tl-head", "data-from": from, "data-to": to });
    const axis = svg("g", { class: "tl-axis" });
    const step = niceStep(span, P);
    const grid = [];
    for (let t = Math.ceil(from / step) * step; t <= to; t += step) {
      grid.push(t);
      axis.append(svg("line", { x1: x(t), x2: x(t), y1: AXIS - 4, y2: H, class: "tl-grid" }));
      const label = step >= 864e5 ? new Date(t).toISOString().slice(5, 10)
        : step >= 6e4 ? new Date(t).toISOString().slice(11, 16) : clock(t);
      axis.append(svg("text", { x: x(t) + 2, y: 12 }, label));
    }
    axis.append(svg("text", { x: 4, y: 12 }, "UTC"));
    top.append(axis);
    T.bands = []; T.gaps = [];
    const nowMs = d.now_ms;
    lanes.forEach((ns, i) => {
      const y = AXIS + i * LANE;
      top.append(svg("text", { x: 4, y: y + 13, class: "tl-label" }, ns.length > 28 ? ns.slice(0, 27) + "\u2026" : ns));
      const terms = byNs.get(ns);
      let prevEnd = null;
      terms.forEach((t, k) => {
        const end = t.ended_ms ?? (t.current ? nowMs : t.seen_ms);
        if (prevEnd != null && t.started_ms > prevEnd) {
          const gap = svg("rect", { x: x(prevEnd), y: y + 2, width: Math.max(2, x(t.started_ms) - x(prevEnd)),
            height: LANE - 4, class: "gap", "data-namespace": ns, "data-ms": t.started_ms - prevEnd });
          gap.append(svg("title", {}, `${ns}: no leader for ${words((t.started_ms - prevEnd) / 1000)}\n` +
            `from ${when(prevEnd)} (last sign of the previous leader) to ${when(t.started_ms)}`));
          top.append(gap);
          T.gaps.push({ namespace: ns, from_ms: prevEnd, to_ms: t.started_ms });
        }
        const x0 = x(t.started_ms), x1 = x(end);
        const band = svg("rect", { x: x0, y: y + 2, width: Math.max(2, x1 - x0), height: LANE - 4,
          class: `band ${k % 2 ? "b" : "a"}${t.ended_ms == null && !t.current ? " open" : ""}`,
          "data-namespace": ns, "data-term": t.term, "data-leader": t.leader });
        const how = t.ended_ms != null ? `ended ${when(t.ended_ms)} (stepped down)`
          : t.current ? "leading now" : `last seen ${when(t.seen_ms)} (stopped without a word: crashed or cut off)`;
        band.append(svg("title", {}, `${ns}: ${t.leader}\nterm began ${when(t.started_ms)} (term ${t.term})\n` +
          `${how}\nled for ${words((end - t.started_ms) / 1000)}`));
        top.append(band);
        if (x1 - x0 > 60) top.append(svg("text", { x: x0 + 3, y: y + 13, class: "band-text" },
          `${t.leader}`.slice(0, Math.floor((x1 - x0 - 6) / 6))));
        T.bands.push({ namespace: ns, term: t.term, leader: t.leader, from_ms: t.started_ms, to_ms: end });
        prevEnd = Math.max(prevEnd ?? end, end);
      });
    });
    if (nowMs >= from && nowMs <= to) top.append(svg("line", { x1: x(nowMs), x2: x(nowMs), y1: AXIS - 4, y2: H, class: "tl-now" }));
    // runs: one row per entry that has runs in the window, by name. The server sent what the
    // plot's pixel columns can show: per entry and column, the worst mark and how many runs
    // it stands for (the details of a mark come from api/mark when it is pointed at).
    const cm = d.column_ms, perCol = (cm / span) * P;
    const late = new Map();  // "row:i" -> ms
    const rows = d.rows.map((r) => ({ name: d.entries[r[0]], key: d.keys[r[0]], r }));
    const q = S.query.toLowerCase();
    let shown = rows.filter((row) => !q || row.name.toLowerCase().includes(q));
    shown.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    const BH = Math.max(1, shown.length) * ROW + 4;
    const low = svg("svg", { width: W, height: BH, class: "tl-body" });
    for (const t of grid) low.append(svg("line", { x1: x(t), x2: x(t), y1: 0, y2: BH, class: "tl-grid" }));
    for (const b of T.bands) if (b.to_ms >= from) {
      // faint term edges across the rows: which leader sent what
      low.append(svg("line", { x1: x(b.from_ms), x2: x(b.from_ms), y1: 0, y2: BH, class: "tl-grid" }));
    }
    const kinds = d.kinds;
    const counts = Object.fromEntries(kinds.map((k) => [k, 0]));
    const flagged = [];  // the marks that went wrong, for a reader of the page (and its tests)
    const frag = document.createDocumentFragment();
    let total = 0;
    shown.forEach((row, i) => {
      const y = 2 + i * ROW;
      const [, steps, marks, many, lateMs] = row.r;
      row.y = y;
      frag.append(svg("text", { x: 4, y: y + 10, class: "tl-label entry", "data-entry": row.name },
        row.name.length > 30 ? row.name.slice(0, 29) + "\u2026" : row.name));
      const paths = kinds.map(() => []);
      const n = steps.length;
      row.xs = new Float64Array(n);
      row.cols = new Int32Array(n);
      row.n = new Map();
      for (let k = 0; k < many.length; k += 2) row.n.set(many[k], many[k + 1]);
      row.late = new Map();
      for (let k = 0; k < lateMs.length; k += 2) row.late.set(lateMs[k], lateMs[k + 1]);
      let col = 0;
      for (let k = 0; k < n; k++) {
        col += steps[k];
        row.cols[k] = col;
        const c = marks.charCodeAt(k) - 48, cls = kinds[c];
        const mx = L + (col + 0.5) * perCol;
        row.xs[k] = mx;
        counts[cls] += 1;
        total += 1;
        const m = mx.toFixed(1);
        if (cls === "missed" || cls === "skipped") {
          paths[c].push(`M${(mx - 3).toFixed(1)} ${y + 1}l6 10M${(mx + 3).toFixed(1)} ${y + 1}l-6 10`);
        } else {
          paths[c].push(`M${(mx - 1.5).toFixed(1)} ${y + 1}h3v10h-3z`);
        }
        if (cls === "late") {  // how late: a thin line back to when it fell due
          const back = (L + ((from + (col + 0.5) * cm - row.late.get(k) - from) / span) * P).toFixed(1);
          paths[c].push(`M${back} ${y + 5}H${m}v1H${back}z`);
        }
        if (cls !== "on-time" && cls !== "run-now")
          flagged.push({ entry: row.name, key: row.key, kind: cls, sent_ms: from + (col + 0.5) * cm,
            from_ms: from + col * cm, to_ms: from + (col + 1) * cm, runs: row.n.get(k) || 1 });
      }
      // the worst on top: where marks touch (a column is narrower than a mark), it shows
      paths.forEach((p, c) => {
        if (!p.length) return;
        const cls = kinds[c], open = cls === "missed" || cls === "skipped";
        frag.append(svg("path", { d: p.join(""), class: `mark m-${cls}${open ? " cross" : ""}`,
          "data-entry": row.name, "data-kind": cls }));
      });
    });
    low.append(frag);
    head.replaceChildren(top);
    body.replaceChildren(low);
    TL.rows = shown;
    TL.details = new Map();
    T.marks = counts;
    T.columns = total;
    T.flagged = flagged.slice(-200);
    T.runs = d.runs;
    T.entries = shown.length;
    set($("#tl-range"), `${when(from)} \u2013 ${when(to)}`);
    set($("#tl-count"), `${d.runs} runs of ${shown.length} entries in ${total} marks ` +
      `(a column is ${words(cm / 1000)}); ${d.terms.length} terms`);
    T.renders += 1;
    T.lastRenderMs = performance.now() - started;
    if (T.firstRenderMs == null) {
      T.firstRenderDurationMs = T.lastRenderMs;
      requestAnimationFrame(() => requestAnimationFrame(() => { T.firstRenderMs = performance.now(); }));
    }
  }
  function markAt(ev) {
    // the mark under the pointer: its row from y, the nearest mark within 4 px from x (or the
    // worst within 2 px)
    const box = $("#tl-body svg");
    if (!box || !TL.data) return null;
    const rect = box.getBoundingClientRect();
    const px = ev.clientX - rect.left, py = ev.clientY - rect.top;
    const row = TL.rows[Math.floor((py - 2) / 14)];
    if (!row || !row.xs || !row.xs.length) return null;
    let lo = 0, hi = row.xs.length - 1;
    while (lo < hi) { const mid = (lo + hi) >> 1; if (row.xs[mid] < px) lo = mid + 1; else hi = mid; }
    let best = lo;
    if (lo > 0 && Math.abs(row.xs[lo - 1] - px) < Math.abs(row.xs[lo] - px)) best = lo - 1;
    if (Math.abs(row.xs[best] - px) > 4) return null;
    // marks wider than a column overlap, the worst on top: the one under the pointer is the
    // worst of those drawn there
    const code = (k) => row.r[2].charCodeAt(k);
    for (let k = Math.max(0, best - 4); k < Math.min(row.xs.length, best + 5); k++)
      if (Math.abs(row.xs[k] - px) <= 2 && (code(k) > code(best) || Math.abs(row.xs[best] - px) > 2)) best = k;
    const d = TL.data, col = row.cols[best];
    const from = d.from_ms + col * d.column_ms;
    return {
      row, i: best, id: `${row.key}:${from}`, from_ms: from, to_ms: from + d.column_ms,
      kind: d.kinds[row.r[2].charCodeAt(best) - 48], runs: row.n.get(best) || 1, late_ms: row.late.get(best),
    };
  }
  function markDetail(hit) {
    // the runs behind a mark, asked once per mark and data (a small indexed read)
    let p = TL.details.get(hit.id);
    if (!p) {
      p = getJSON(`api/mark?key=${hit.row.key}&from_ms=${hit.from_ms}&to_ms=${hit.to_ms}`)
        .then(async (r) => { const b = await r.json(); if (!r.ok) throw new Error(b.error || r.statusText); return b; });
      p.catch(() => TL.details.delete(hit.id));
      TL.details.set(hit.id, p);
    }
    return p;
  }
  const plural = (n, w) => `${n} ${w}${n === 1 ? "" : "s"}`;
  function runWhat(cls, kind, count, lateMs) {
    return {
      "on-time": "ran on time", late: `ran late by ${words(lateMs / 1000)}`,
      missed: `${plural(count, "run")} missed (catch-up policy)`,
      skipped: `${plural(count, "run")} skipped (overlap policy: the last one still ran)`,
      "run-now": "run now (asked by an operator)", failed: `${kind === "run_now" ? "run now" : "run"}: failed`,
    }[cls];
  }
  function markLines(hit, detail) {
    // what the timeline knows at once, then (detail) the worst run of the mark itself
    const span = hit.to_ms - hit.from_ms;
    const col = span >= 1000 ? `${clock(hit.from_ms)}\u2013${clock(hit.to_ms)}` : when(hit.from_ms);
    const lines = [["entry", hit.row.name]];
    if (hit.runs > 1) lines.push(["mark", `${hit.runs} runs ${col}, the worst shown`]);
    const r = detail && detail.run;
    if (!r) {
      const what = hit.kind === "late" ? `late by up to ${words(hit.late_ms / 1000)}` : hit.kind.replace("-", " ");
      return [...lines, ["what", what], ["when", col], ["details", detail ? "no run here any more" : "loading\u2026"]];
    }
    const ns = (TL.data.terms.find((t) => t.term === r.term) || {}).namespace;
    if (hit.runs > 1) lines.push(["of which", Object.entries(detail.counts).map(([k, n]) => `${n} ${k}`).join(", ")]);
    return [
      ...lines, ["what", runWhat(r.mark, r.kind, r.count, r.sent_ms - r.due_ms)],
      [r.kind === "run" || r.kind === "run_now" ? "sent" : "decided", when(r.sent_ms)],
      ["due", r.due_ms != null ? when(r.due_ms) : "\u2014"],
      ["term", `${termText(ns, r.term)} (term ${r.term})`],
      ["task id", r.task_id || "\u2014"],
      ["outcome", r.outcome || "\u2014"],
      ["duration", r.duration != null ? words(r.duration) : "\u2014"],
    ];
  }
  async function loadTimeline() {
    const started = performance.now();
    const win = TL.windowMs;
    const params = win === "all" ? "from_ms=0" : `from_ms=${Math.round(now() - win)}`;
    TL.loading = (TL.loading || 0) + 1;
    try {
      const r = await getJSON(`api/timeline?${params}&width=${timelineWidth() - 198}`);
      const body = await r.json();
      if (!r.ok) throw new Error(body.error || r.statusText);
      TL.data = body;
      if (T.loadMs == null) T.loadMs = performance.now() - started;
      renderTimeline();
    } finally {
      TL.loading -= 1;
    }
  }
  function timelineDue() {
    // a short window follows every poll; a long one every tenth
    if (!$("#tl-live").checked) return false;
    TL.polls += 1;
    const win = TL.windowMs === "all" ? Infinity : TL.windowMs;
    return win <= 6 * 3600000 || TL.polls % 10 === 1;
  }
  $("#tl-window").addEventListener("change", (ev) => {
    TL.windowMs = ev.target.value === "all" ? "all" : Number(ev.target.value);
    TL.polls = 0;
    loadTimeline().catch((err) => message(`timeline: ${err.message}`, true));
  });
  function showTip(lines, at) {
    const tip = $("#tl-tip");
    tip.textContent = lines.map(([k, v]) => `${k}: ${v}`).join("\n");
    tip.hidden = false;
    const box = $("#timeline-section").getBoundingClientRect();
    const x = at.clientX - box.left;  // right of the pointer, or left of it in the right half
    tip.style.left = `${x > box.width / 2 ? Math.max(0, x - 12 - tip.offsetWidth) : x + 12}px`;
    const y = at.clientY - box.top;  // below the pointer, or above it near the bottom
    tip.style.top = `${y + 14 + tip.offsetHeight > box.height ? y - 10 - tip.offsetHeight : y + 14}px`;
  }
  $("#tl-scroll").addEventListener("mousemove", (ev) => {
    const hit = markAt(ev);
    if (!hit) { TL.hover = null; $("#tl-tip").hidden = true; return; }
    const at = { clientX: ev.clientX, clientY: ev.clientY };
    if (TL.hover === hit.id) { showTip(TL.hoverLines, at); return; }
    TL.hover = hit.id;
    TL.hoverLines = markLines(hit, null);
    showTip(TL.hoverLines, at);
    markDetail(hit).then((detail) => {
      if (TL.hover !== hit.id) return;
      TL.hoverLines = markLines(hit, detail);
      showTip(TL.hoverLines, at);
    }).catch((err) => { if (TL.hover === hit.id) showTip([...TL.hoverLines, ["error", err.message]], at); });
  });
  $("#tl-scroll").addEventListener("mouseleave", () => { TL.hover = null; $("#tl-tip").hidden = true; });
  $("#tl-scroll").addEventListener("click", (ev) => {
    const label = ev.target.closest("text[data-entry]");
    if (label) { openDetail(label.getAttribute("data-entry")); return; }
    const hit = markAt(ev);
    const pinned = $("#tl-pinned");
    if (!hit) { TL.pinned = null; pinned.hidden = true; return; }
    const pin = (lines) => {
      pinned.replaceChildren(...lines.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
      pinned.hidden = false;
    };
    TL.pinned = hit.id;
    pin(markLines(hit, null));
    markDetail(hit).then((detail) => { if (TL.pinned === hit.id) pin(markLines(hit, detail)); })
      .catch((err) => message(`timeline: ${err.message}`, true));
  });
  window.addEventListener("resize", () => renderTimeline());

  // -- polling -----------------------------------------------------------------------------
  async function loadState() {
    const r = await getJSON("api/state");
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    renderState(body);
  }
  async function loadEntries() {
    const started = performance.now();
    const r = await getJSON("api/entries", S.etag ? { "If-None-Match": S.etag } : {});
    if (r.status === 304) return;
    const body = await r.json();
    if (!r.ok) throw new Error(body.error || r.statusText);
    for (const e of body.entries) e._text = `${e.name} ${e.task} ${e.schedule} ${e.state}`.toLowerCase();
    S.entries = body.entries;
    S.etag = r.headers.get("ETag");
    if (M.entriesLoadMs == null) M.entriesLoadMs = performance.now() - started;
  }
  async function poll() {
    if (TL.loading) {
      // a window just chosen is being fetched: the table's refresh waits, so the two do
      // not share the server (a day of 1,000 entries is most of a second of its time)
      setTimeout(poll, POLL_MS / 4);
      return;
    }
    try {
      await Promise.all([loadState(), loadEntries()]);
      renderTable();
      if (timelineDue()) await loadTimeline();
      if (S.detail) await loadDetail(false);
      S.lastOk = Date.now();
      M.polls += 1;
    } catch (err) {
      message(`cannot refresh: ${err.message}`, true);
    }
    const stale = Date.now() - S.lastOk > 3 * POLL_MS;
    set($("#updated"), S.lastOk ? `updated ${new Date(S.lastOk).toLocaleTimeString()}` : "loading\u2026");
    $("#updated").classList.toggle("stale", stale);
    setTimeout(poll, POLL_MS);
  }

  // -- actions -----------------------------------------------------------------------------
  async function act(name, action, extra = {}) {
    const headers = { "Content-Type": "application/json", "X-CSRF-Token": csrf };
    if (token()) headers.Authorization = `Bearer ${token()}`;
    const r = await fetch("api/actions", {
      method: "POST", headers, body: JSON.stringify({ name, action, ...extra }),
    });
    let body = {};
    try { body = await r.json(); } catch (_) { /* an empty answer */ }
    if (!r.ok) {
      message(`${action} ${name}: ${r.status} ${body.error || r.statusText}`, true);
      return false;
    }
    const what = action === "run_now" && body.requested === false ? "a run is already pending for" : `${action.replace("_", " ")}:`;
    message(`${what} ${name} (as ${body.actor})`);
    S.etag = null;
    await loadEntries().then(renderTable).catch(() => {});
    if (S.detail === name) await loadDetail(false);
    return true;
  }

  // -- the detail view ---------------------------------------------------------------------
  async function loadDetail(fillForm) {
    const name = S.detail;
    const r = await getJSON(`api/entry?name=${encodeURIComponent(name)}`);
    const body = await r.json();
    if (!r.ok) { message(body.error || r.statusText, true); return; }
    if (S.detail !== name) return;
    const e = body.entry;
    set($("#detail-name"), e.name);
    const fields = [
      ["task", e.task], ["kind", e.kind], ["schedule", e.schedule], ["time zone", e.tz ?? "\u2014"],
      ["next due", e.enabled && !e.paused ? when(e.next_due_ms) || "never" : e.state],
      ["overdue", e.overdue > 0 ? `${age(e.overdue)} past its grace` : "no"],
      ["state", e.state + (e.run_now_pending ? " (run now pending)" : "")],
      ["unsent run", e.pending_since_ms != null ? `claimed ${when(e.pending_since_ms)}, not yet taken by the broker` : "none"],
      [e.args_hidden ? "args (argsrepr)" : "args", JSON.stringify(e.args)],
      [e.args_hidden ? "kwargs (kwargsrepr)" : "kwargs", JSON.stringify(e.kwargs)],
      ["options", JSON.stringify(e.options)], ["policies", JSON.stringify(e.policies)],
      ["start / expires", `${e.start_at || "-"} / ${e.expires_at || "-"}`],
      ["runs", e.total_run_count], ["last run", when(e.last_run_ms) || "never"],
      ["changed", e.updated_at_ms ? `${when(e.updated_at_ms)} by ${e.updated_by}` : "-"],
    ];
    $("#detail-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))]));
    for (const b of document.querySelectorAll("[data-detail-action]")) {
      const a = b.dataset.detailAction;
      b.hidden = !S.canAct || (a === "pause" && e.paused) || (a === "resume" && !e.paused)
        || (a === "enable" && e.enabled) || (a === "disable" && !e.enabled);
    }
    $("#edit-form").hidden = !S.canAct;
    if (fillForm) {
      const f = $("#edit-form");
      f.schedule.value = e.schedule_input || "";
      f.tz.value = e.tz && !e.tz.endsWith("(app)") && e.schedule_input && e.schedule_input.split(" ").length === 5 ? e.tz : "";
      f.schedule.disabled = f.tz.disabled = e.kind === "static";
      for (const k of ["catch_up", "catch_up_max", "grace", "overlap", "overlap_timeout"]) f[k].value = e.policies[k] ?? "";
      f.dataset.initial = JSON.stringify(formValues());
      set($("#edit-note"), e.kind === "static" ? "A static beat_schedule entry: only its policies change here (the code defines the rest)." : "");
    }
    $("#history tbody").replaceChildren(...body.history.map((h) => el("tr", {},
      el("td", {}, when(h.sent_ms)), el("td", {}, h.count > 1 ? `${h.kind} x${h.count}` : h.kind),
      el("td", {}, String(h.term)), el("td", {}, h.task_id || "-"),
      el("td", { class: `outcome-${h.outcome || h.kind}` }, h.outcome || "-"),
      el("td", {}, h.duration != null ? `${h.duration.toFixed(3)}s` : "-"), el("td", {}, when(h.due_ms)))));
    $("#changes").replaceChildren(...body.changes.map((c) => el("li", {},
      el("span", { class: "muted" }, `${when(c.at_ms)} `), `${c.action} by ${c.actor} `,
      el("code", {}, Object.keys(c.detail).length ? JSON.stringify(c.detail) : ""))));
  }
  function formValues() {
    const f = $("#edit-form");
    const out = {};
    for (const k of ["schedule", "tz", "catch_up", "catch_up_max", "grace", "overlap", "overlap_timeout"]) {
      if (f[k].disabled) continue;
      let v = f[k].value.trim();
      if (["catch_up_max", "grace", "overlap_timeout"].includes(k)) v = v === "" ? null : Number(v);
      out[k] = v;
    }
    return out;
  }
  function openDetail(name) {
    S.detail = name;
    const d = $("#detail");
    if (!d.open) d.showModal();
    loadDetail(true);
  }

  // -- wiring ------------------------------------------------------------------------------
  $("#entries tbody").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-action]");
    if (!b) return;
    const name = b.closest("tr").dataset.entry;
    if (b.dataset.action === "detail") openDetail(name);
    else act(name, b.dataset.action);
  });
  $("#detail").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-detail-action]");
    if (b) act(S.detail, b.dataset.detailAction, b.dataset.missed ? { missed: b.dataset.missed } : {});
  });
  $("#detail").addEventListener("close", () => { S.detail = null; });
  $("#detail-close").addEventListener("click", () => $("#detail").close());
  $("#edit-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const initial = JSON.parse(ev.target.dataset.initial || "{}");
    const now = formValues();
    const changes = {};
    for (const [k, v] of Object.entries(now)) if (JSON.stringify(v) !== JSON.stringify(initial[k])) changes[k] = v;
    if ("tz" in changes || "schedule" in changes) { changes.schedule = now.schedule; changes.tz = now.tz; }
    if (!Object.keys(changes).length) { message("nothing changed"); return; }
    if (await act(S.detail, "edit", { changes })) loadDetail(true);
  });
  $("#entries thead").addEventListener("click", (ev) => {
    const th = ev.target.closest("th[data-sort]");
    if (!th) return;
    S.sort = { key: th.dataset.sort, dir: S.sort.key === th.dataset.sort ? -S.sort.dir : 1 };
    renderTable();
  });
  $("#search").addEventListener("input", (ev) => { S.query = ev.target.value; S.page = 0; renderTable(); });
  $("#state-filter").addEventListener("change", (ev) => { S.state = ev.target.value; S.page = 0; renderTable(); });
  $("#page-size").addEventListener("change", (ev) => { S.size = Number(ev.target.value); S.page = 0; renderTable(); });
  $("#prev").addEventListener("click", () => { S.page -= 1; renderTable(); });
  $("#next").addEventListener("click", () => { S.page += 1; renderTable(); });
  async function whoami() {
    const r = await getJSON("api/whoami");
    const body = await r.json();
    set($("#actor"), token() ? (body.actor ? `acting as ${body.actor}` : "token not accepted") : "");
  }
  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const value = $("#token").value.trim();
    if (value) sessionStorage.setItem(KEY, value);
    $("#token").value = "";
    whoami();
  });
  $("#forget").addEventListener("click", () => { sessionStorage.removeItem(KEY); whoami(); });
  whoami().catch(() => {});
  poll();
})();
