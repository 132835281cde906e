// danube's built-in console: plain DOM, no framework, no build step. Every value from the server is
// put in the page with textContent (never as HTML). Views re-render from the gateway's /ui/v1 API.
"use strict";

const API = "/ui/v1";
const REFRESH_MS = 5000;
let timer = null;
let notice = null;          // {text, bad} shown once on the next render
let lastPlan = null;        // the rebalance planner's last answer (dry run)

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const svg = (tag, attrs) => {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  return el;
};

const fmt = (n) => (typeof n === "number" ? (Number.isInteger(n) ? n.toLocaleString("en") : n.toFixed(2)) : (n ?? "–"));
const enc = encodeURIComponent;

async function getJSON(path) {
  const r = await fetch(API + path, { headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.message || body.error || r.statusText);
  return body;
}

async function postJSON(path, doc) {
  const headers = { "Content-Type": "application/json" };
  const token = document.getElementById("token").value.trim();
  if (token) headers.Authorization = "Bearer " + token;
  const r = await fetch(API + path, { method: "POST", headers, body: JSON.stringify(doc) });
  const body = await r.json().catch(() => ({}));
  if (!r.ok || body.success === false) throw new Error(body.message || body.error || body.error_message || r.statusText);
  return body;
}

function confirmThen(text, action) {
  const modal = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  modal.classList.remove("hidden");
  const ok = document.getElementById("confirm-ok");
  const cancel = document.getElementById("confirm-cancel");
  const close = () => { modal.classList.add("hidden"); ok.onclick = null; cancel.onclick = null; };
  cancel.onclick = close;
  ok.onclick = async () => {
    close();
    try {
      const res = await action();
      notice = { text: res && res.message ? `Done: ${res.message}` : "Done", bad: false };
    } catch (e) {
      notice = { text: "Failed: " + e.message, bad: true };
    }
    render();
  };
}

function table(columns, rows, empty) {
  if (!rows.length) return h("p", { class: "muted" }, empty || "None.");
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.num ? "num" : null }, c.title)))),
    h("tbody", {}, rows.map((r) => h("tr", {}, columns.map((c) => h("td", { class: c.num ? "num" : null }, c.cell(r)))))));
}

const cards = (pairs) => h("div", { class: "cards" },
  pairs.map(([k, v]) => h("div", { class: "card" }, h("div", { class: "v" }, fmt(v)), h("div", { class: "k" }, k))));

const errorsOf = (page) => (page.errors && page.errors.length ? h("p", { class: "errors" }, page.errors.join(" · ")) : null);
const topicLink = (name) => h("a", { href: "#/topic/" + enc(name), class: "topic-link" }, name);

// ------------------------------------------------------------------ charts (inline SVG)

function lineChart(title, series, opts) {
  const W = 520, H = 170, P = 34;
  const box = h("div", { class: "chart", "data-chart": title }, h("div", { class: "title" }, title));
  const el = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img" });
  const all = series.flatMap((s) => s.points);
  if (!all.length) {
    const t = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: "#6b7385", "font-size": 12 });
    t.textContent = "no data yet";
    el.append(t);
    box.append(el);
    return box;
  }
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y1 = Math.max(...ys, 1e-9) * 1.1;
  const X = (x) => P + ((x - x0) / (x1 - x0)) * (W - P - 8);
  const Y = (y) => H - 18 - (y / y1) * (H - 30);
  el.append(svg("line", { x1: P, y1: H - 18, x2: W - 8, y2: H - 18, stroke: "#c9ceda" }));
  for (const frac of [0.5, 1]) {
    const label = svg("text", { x: P - 4, y: Y(y1 * frac / 1.1) + 4, "text-anchor": "end", fill: "#6b7385", "font-size": 10 });
    label.textContent = fmt(Number((y1 * frac / 1.1).toPrecision(3)));
    el.append(label);
  }
  const colors = ["#2f6fde", "#e07b26", "#1f8a4c", "#9b3fcf"];
  series.forEach((s, i) => {
    if (!s.points.length) return;
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ");
    const max = Math.max(...s.points.map((p) => p[1]));
    el.append(svg("path", { d, fill: "none", stroke: colors[i % colors.length], "stroke-width": 1.6, class: "series", "data-name": s.name, "data-max": max }));
    const last = s.points[s.points.length - 1];   // a dot on the newest point: visible even with one point
    el.append(svg("circle", { cx: X(last[0]).toFixed(1), cy: Y(last[1]).toFixed(1), r: 2.5, fill: colors[i % colors.length] }));
    const legend = svg("text", { x: P + 6 + i * 150, y: 12, fill: colors[i % colors.length], "font-size": 11 });
    legend.textContent = s.name + (opts && opts.unit ? ` (${opts.unit})` : "");
    el.append(legend);
  });
  box.append(el);
  return box;
}

// ------------------------------------------------------------------ views

async function clusterView() {
  const page = await getJSON("/cluster");
  const drain = (b) => confirmThen(`Drain broker ${b.broker_id}? All its topics move to other brokers.`,
    () => postJSON("/cluster/actions", { action: "unload", broker_id: b.broker_id }));
  const activate = (b) => confirmThen(`Activate broker ${b.broker_id}? It takes new topics again.`,
    () => postJSON("/cluster/actions", { action: "activate", broker_id: b.broker_id }));
  const bal = page.balance;
  return [
    h("h1", {}, "Cluster"),
    cards([["brokers", page.totals.broker_count], ["topics", page.totals.topics_total],
      ["connections", page.totals.active_connections],
      ["calls", page.totals.rpc_total], ["call errors", page.totals.rpc_errors_total],
      ["load CV", bal ? Number(bal.coefficient_of_variation.toFixed(3)) : "–"]]),
    h("h2", {}, "Brokers"),
    table([
      { title: "broker", cell: (b) => h("a", { href: "#/broker/" + enc(b.broker_id), class: "broker-link" }, b.broker_id) },
      { title: "address", cell: (b) => b.broker_addr },
      { title: "role", cell: (b) => h("span", { class: "pill" + (b.is_leader ? " leader" : "") }, b.is_leader ? "leader" : b.broker_role) },
      { title: "status", cell: (b) => h("span", { class: "pill" + (b.broker_status === "active" ? "" : " bad") }, b.broker_status) },
      { title: "topics", num: true, cell: (b) => fmt(b.stats.topics_owned) },
      { title: "connections", num: true, cell: (b) => fmt(b.stats.active_connections) },
      { title: "calls", num: true, cell: (b) => fmt(b.stats.rpc_total) },
      { title: "calls /s", num: true, cell: (b) => fmt(Number(b.stats.rpc_rate_1m.toFixed(1))) },
      { title: "errors", num: true, cell: (b) => fmt(b.stats.rpc_errors_total) },
      { title: "load", num: true, cell: (b) => (b.load === null || b.load === undefined ? "–" : fmt(b.load)) },
      { title: "", cell: (b) => (b.broker_status === "active"
        ? h("button", { class: "danger", onclick: () => drain(b) }, "Drain")
        : h("button", { onclick: () => activate(b) }, "Activate")) },
    ], page.brokers, "No brokers."),
    errorsOf(page),
  ];
}

async function topicsView() {
  const [page, ns] = await Promise.all([getJSON("/topics"), getJSON("/namespaces")]);
  const rows = page.brokers.flatMap((b) => b.topics.map((t) => ({ ...t, broker: b.broker.broker_id })));
  const placed = new Set(rows.map((r) => r.name));
  for (const n of ns.namespaces) for (const t of n.topics) if (!placed.has(t)) rows.push({ name: t, broker: null });
  rows.sort((a, b) => a.name.localeCompare(b.name));
  const name = h("input", { id: "new-topic", placeholder: "/namespace/topic", required: true });
  const parts = h("input", { id: "new-partitions", type: "number", min: 0, value: 0, class: "narrow" });
  const reliable = h("input", { id: "new-reliable", type: "checkbox", checked: true });
  const create = (ev) => {
    ev.preventDefault();
    const doc = { action: "create", topic: name.value.trim(), dispatch_strategy: reliable.checked ? "reliable" : "non_reliable" };
    if (Number(parts.value) > 0) doc.partitions = Number(parts.value);
    confirmThen(`Create topic ${doc.topic}${doc.partitions ? ` with ${doc.partitions} partitions` : ""}?`,
      () => postJSON("/topics/actions", doc));
  };
  return [
    h("h1", {}, "Topics"),
    h("form", { class: "inline", id: "create-topic", onsubmit: create }, "New topic", name, "partitions", parts,
      h("label", {}, reliable, " reliable"), h("button", { type: "submit", class: "primary" }, "Create")),
    table([
      { title: "topic", cell: (t) => topicLink(t.name) },
      { title: "broker", cell: (t) => t.broker || h("span", { class: "muted" }, "not loaded") },
      { title: "delivery", cell: (t) => t.delivery || "–" },
      { title: "producers", num: true, cell: (t) => fmt(t.producers_connected) },
      { title: "consumers", num: true, cell: (t) => fmt(t.consumers_connected) },
      { title: "subscriptions", num: true, cell: (t) => fmt(t.subscriptions) },
      { title: "backlog", num: true, cell: (t) => fmt(t.backlog) },
      { title: "messages in", num: true, cell: (t) => fmt(t.msg_in_total) },
    ], rows, "No topics yet."),
    errorsOf(page),
  ];
}

async function topicView(name) {
  const now = Math.floor(Date.now() / 1000);
  const [page, series] = await Promise.all([
    getJSON("/topics/" + enc(name)),
    getJSON(`/topics/${enc(name)}/series?from=${now - 900}&to=${now}&step=5s`),
  ]);
  const s = Object.fromEntries(series.series.map((x) => [x.name, x]));
  const pick = (...names) => names.filter((n) => s[n]).map((n) => s[n]);
  const t = page.topic, m = page.metrics;
  const unload = () => confirmThen(`Unload ${name}? Its clients reconnect and the topic is placed again.`,
    () => postJSON("/topics/actions", { action: "unload", topic: name }));
  const del = () => confirmThen(`Delete ${name} and all its messages? This cannot be undone.`,
    async () => { const r = await postJSON("/topics/actions", { action: "delete", topic: name }); location.hash = "#/topics"; return r; });
  const storage = t.storage;
  const part = t.partitioning;
  return [
    h("h1", {}, "Topic ", h("span", { id: "topic-name" }, t.name)),
    h("div", { class: "inline" },
      h("button", { id: "unload-topic", onclick: unload }, "Unload"), " ",
      h("button", { id: "delete-topic", class: "danger", onclick: del }, "Delete")),
    h("p", {}, "broker ", h("b", {}, t.broker_id || (t.partitions ? "per partition" : "not loaded")), " · delivery ", h("b", {}, t.delivery || "–"),
      t.schema_subject ? [" · schema ", h("a", { href: "#/schema/" + enc(t.schema_subject) }, t.schema_subject),
        ` v${t.schema_version ?? "?"} (${t.schema_type ?? "?"})`] : " · no schema"),
    cards([["messages in", m.core.msg_in_total], ["messages out", m.core.msg_out_total],
      ["publish /s", m.rates.publish_rate_1m], ["dispatch /s", m.rates.dispatch_rate_1m],
      ["backlog", m.msg_backlog], ["producers", m.active.producers], ["consumers", m.active.consumers],
      ["p95 send ms", m.latency_size.send_latency_ms_p95]]),
    m.reliable ? cards([["WAL flushes", m.reliable.wal_flush_total],
      ["p50 flush ms", Number(m.reliable.wal_flush_latency_ms_p50.toFixed(2))],
      ["p95 flush ms", Number(m.reliable.wal_flush_latency_ms_p95.toFixed(2))],
      ["p99 flush ms", Number(m.reliable.wal_flush_latency_ms_p99.toFixed(2))]]) : null,
    h("h2", {}, "Rates and backlog (last 15 min, source: " + (series.source || "?") + ")"),
    h("div", { class: "charts" },
      lineChart("messages / s", pick("publish_rate_1m", "dispatch_rate_1m")),
      lineChart("backlog (messages)", pick("backlog_messages"))),
    h("h2", {}, "Subscriptions"),
    table([
      { title: "subscription", cell: (x) => x.name },
      { title: "type", cell: (x) => x.subscription_type },
      { title: "backlog", num: true, cell: (x) => fmt(x.backlog) },
      { title: "unacked", num: true, cell: (x) => fmt(x.unacked) },
    ], t.subscriptions, "No subscriptions."),
    storage ? [h("h2", {}, "Storage"),
      h("p", {}, `${storage.mode} (${storage.backend}), offsets ${storage.first_offset}..${Math.max(0, storage.next_offset - 1)}, `
        + `${storage.segment_count} segments, ${fmt(Number(storage.segment_bytes))} bytes`)] : null,
    t.partitions ? [h("h2", {}, "Partitions"), h("p", { id: "partitions" }, t.partitions.map((p) => [topicLink(p), " "]))] : null,
    part ? [h("h2", {}, "Partitioning"), h("p", {}, `${part.partitions} partitions, version ${part.partitioning_version}, `
      + `generation ${part.generation}${part.marker_json ? ", repartition in progress" : ""}`)] : null,
    errorsOf(page), errorsOf(series),
  ];
}

async function brokerView(id) {
  const page = await getJSON("/brokers/" + enc(id));
  return [
    h("h1", {}, "Broker ", page.broker.broker_id),
    h("p", {}, page.broker.broker_addr, " · ", page.broker.broker_role, " · ", page.broker.broker_status),
    cards([["topics", page.metrics.topics_owned], ["bytes in", page.metrics.inbound_bytes_total],
      ["bytes out", page.metrics.outbound_bytes_total], ["connections", page.metrics.active_connections],
      ["calls", page.metrics.rpc_total], ["calls /s", Number(page.metrics.rpc_rate_1m.toFixed(1))],
      ["call errors", page.metrics.rpc_errors_total], ["server errors", page.metrics.errors_5xx_total],
      ["WAL sync rounds", page.metrics.wal_sync_rounds_total],
      ["p95 round ms", Number(page.metrics.wal_sync_round_latency_ms_p95.toFixed(2))]]),
    h("h2", {}, "Topics"),
    table([
      { title: "topic", cell: (t) => topicLink(t.name) },
      { title: "delivery", cell: (t) => t.delivery },
      { title: "producers", num: true, cell: (t) => fmt(t.producers_connected) },
      { title: "consumers", num: true, cell: (t) => fmt(t.consumers_connected) },
      { title: "backlog", num: true, cell: (t) => fmt(t.backlog) },
    ], page.topics, "No topics on this broker."),
    errorsOf(page),
  ];
}

async function rebalancingView() {
  const history = await getJSON("/cluster/rebalancing-history").catch((e) => ({ moves: [], errors: [e.message] }));
  const balance = await getJSON("/cluster/balance").catch(() => null);
  const out = h("div", { id: "proposal" });
  const show = () => {   // the last plan stays on the page across refreshes
    if (!lastPlan) return;
    if (lastPlan.error) out.replaceChildren(h("p", { class: "errors" }, lastPlan.error));
    else out.replaceChildren(h("p", {}, lastPlan.message || ""), table([
      { title: "topic", cell: (m) => topicLink(m.topic_name) },
      { title: "from", cell: (m) => m.from_broker }, { title: "to", cell: (m) => m.to_broker },
      { title: "load", num: true, cell: (m) => fmt(m.estimated_load) },
    ], lastPlan.proposed_moves, "The planner proposes no move."));
  };
  const plan = async () => {
    out.replaceChildren(h("p", { class: "muted" }, "Planning…"));
    try {
      lastPlan = await postJSON("/cluster/rebalance", { dry_run: true });
    } catch (e) {
      lastPlan = { error: e.message };
    }
    show();
  };
  show();
  return [
    h("h1", {}, "Rebalancing"),
    balance ? cards([["load CV", Number(balance.coefficient_of_variation.toFixed(3))], ["threshold", balance.cv_threshold],
      ["mean load", balance.mean_load], ["strategy", balance.assignment_strategy || "–"]])
      : h("p", { class: "muted" }, "No balance report (a standalone broker has nothing to balance)."),
    h("h2", {}, "Planner's proposal"),
    h("button", { id: "plan", class: "primary", onclick: plan }, "Plan (dry run)"), out,
    h("h2", {}, "History"),
    table([
      { title: "time", cell: (m) => new Date(m.timestamp * 1000).toISOString().replace("T", " ").slice(0, 19) },
      { title: "topic", cell: (m) => topicLink(m.topic_name) },
      { title: "from", cell: (m) => m.from_broker }, { title: "to", cell: (m) => m.to_broker },
      { title: "reason", cell: (m) => m.reason }, { title: "outcome", cell: (m) => m.outcome },
    ], [...history.moves].reverse(), "No moves yet."),
    errorsOf(history),
  ];
}

async function schemasView() {
  const page = await getJSON("/schemas");
  return [
    h("h1", {}, "Schemas"),
    table([
      { title: "subject", cell: (s) => h("a", { href: "#/schema/" + enc(s.subject) }, s.subject) },
      { title: "type", cell: (s) => s.schema_type }, { title: "latest", num: true, cell: (s) => s.latest_version },
      { title: "compatibility", cell: (s) => s.compatibility_mode }, { title: "id", num: true, cell: (s) => s.schema_id },
    ], page.subjects, "No schema subjects in use."),
  ];
}

async function schemaView(subject) {
  const page = await getJSON("/schemas/" + enc(subject));
  return [
    h("h1", {}, "Schema ", page.subject),
    h("p", {}, `${page.schema_type} · compatibility ${page.compatibility_mode} · latest v${page.latest.version}`),
    h("pre", {}, page.latest.schema_definition),
    h("h2", {}, "Versions"),
    table([{ title: "version", num: true, cell: (v) => v.version }, { title: "id", num: true, cell: (v) => v.schema_id },
      { title: "fingerprint", cell: (v) => v.fingerprint }, { title: "description", cell: (v) => v.description }], page.versions),
  ];
}

// ------------------------------------------------------------------ router

const routes = [
  [/^#\/topics$/, topicsView, "topics"],
  [/^#\/topic\/(.+)$/, (m) => topicView(decodeURIComponent(m[1])), "topics"],
  [/^#\/broker\/(.+)$/, (m) => brokerView(decodeURIComponent(m[1])), "cluster"],
  [/^#\/rebalancing$/, rebalancingView, "rebalancing"],
  [/^#\/schemas$/, schemasView, "schemas"],
  [/^#\/schema\/(.+)$/, (m) => schemaView(decodeURIComponent(m[1])), "schemas"],
  [/^.*$/, clusterView, "cluster"],
];

async function render() {
  clearTimeout(timer);
  const hash = location.hash || "#/cluster";
  const [re, view, nav] = routes.find(([r]) => r.test(hash));
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.id === "nav-" + nav));
  const status = document.getElementById("status");
  const main = document.getElementById("view");
  try {
    const content = await view(hash.match(re));
    const shown = notice ? [h("div", { class: "notice" + (notice.bad ? " bad" : ""), id: "notice" }, notice.text)] : [];
    notice = null;
    if (!document.getElementById("confirm").classList.contains("hidden")) return schedule();
    main.replaceChildren(...shown, ...[content].flat(2).filter(Boolean));
    main.dataset.rendered = hash;
    status.textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    main.replaceChildren(h("p", { class: "errors", id: "load-error" }, "Could not load: " + e.message));
    status.textContent = "error";
  }
  schedule();
}

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(() => {
    const editing = document.activeElement && document.activeElement.tagName === "INPUT";
    if (editing || document.hidden) return schedule();
    render();
  }, REFRESH_MS);
}

window.addEventListener("hashchange", render);
document.addEventListener("DOMContentLoaded", () => {
  const token = document.getElementById("token");
  token.value = sessionStorage.getItem("danube-token") || "";
  token.addEventListener("change", () => sessionStorage.setItem("danube-token", token.value.trim()));
  render();
});
