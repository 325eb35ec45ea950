// cts view: the index of a run's records, one sample, and two samples side by side.
// Everything shown comes from run directories (ids, model outputs, web pages) and is untrusted:
// the DOM is built with text nodes only; no markup string is ever parsed.
"use strict";

// ticket: counts renders, so that an answer arriving after a later navigation is dropped.
const STATE = { runs: [], facets: {}, view: null, indexTimer: null, ticket: 0 };
const LABELS = ["full", "partial", "none"];

// -- DOM helpers -------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "data") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  return append(el, children);
}

function append(el, ...children) {
  // Missing parts (null: a section that does not apply) are left out, never shown as "null".
  el.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false)
    .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
  return el;
}

function rendered(view) {
  // For tests and bench/view.py: which view is on screen, and when each was first shown
  // (ms since navigation start).
  document.body.dataset.rendered = view;
  window.__ctsFirstRendered = window.__ctsFirstRendered || {};
  if (!(view in window.__ctsFirstRendered)) window.__ctsFirstRendered[view] = performance.now();
}

function route(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") query.set(key, String(value));
  }
  const text = query.toString();
  return "#" + path + (text ? "?" + text : "");
}

function sampleHref(row) {
  return route("/sample", {
    run: row.run, instance: row.instance_id, condition: row.condition, seed: row.seed,
  });
}

function fmt(score) {
  return score === null || score === undefined ? "–" : Number(score).toFixed(1);
}

function runName(id) {
  const run = STATE.runs.find((r) => r.id === Number(id));
  return run ? run.name : "run " + id;
}

async function api(path, params) {
  const query = params instanceof URLSearchParams ? params : new URLSearchParams(params || {});
  const response = await fetch(path + (query.toString() ? "?" + query : ""));
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined));
  return main;
}

function failure(error) {
  return h("p", { class: "error-box" }, String(error && error.message ? error.message : error));
}

function pre(text, cls) {
  return h("pre", { class: cls || "text" }, text === null || text === undefined ? "" : text);
}

function json(value) {
  return pre(JSON.stringify(value, null, 1), "json");
}

function labelBadge(label) {
  const known = LABELS.includes(label) ? label : "other";
  return h("span", { class: "label label-" + known }, label || "—");
}

// -- routing -----------------------------------------------------------------------------------

function parseHash() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?", 2);
  return { path: path || "/", params: new URLSearchParams(query || "") };
}

async function render() {
  const { path, params } = parseHash();
  const ticket = ++STATE.ticket;
  try {
    if (path === "/sample") await renderSample(params, ticket);
    else if (path === "/compare") await renderCompare(params, ticket);
    else await renderIndex(params, ticket);
  } catch (error) {
    if (ticket !== STATE.ticket) return;
    show(failure(error));
    document.body.dataset.rendered = "error";
  }
}

// -- the index ---------------------------------------------------------------------------------

const FILTERS = [
  "run", "condition", "language", "removed", "failed", "all_unknown",
  "score_min", "score_max", "q", "sort", "order", "offset", "limit", "scope",
];
const COLUMNS = [
  ["run", "run", "run"],
  ["instance", "instance", "instance"],
  ["condition", "condition", "condition"],
  ["seed", "seed", "seed"],
  ["language", "lang", "language"],
  [null, "removed", null],
  ["score", "score", "score"],
  [null, "answers", null],
  ["termination", "termination", "termination"],
  ["stage", "error", "stage"],
  [null, "answer", null],
];

function indexParams(params) {
  const kept = new URLSearchParams();
  for (const key of FILTERS) for (const value of params.getAll(key)) if (value) kept.append(key, value);
  return kept;
}

function go(params) {
  // From the filter form: the form stays as the user left it (focus, half-typed text).
  history.replaceState(null, "", "#/" + (params.toString() ? "?" + params : ""));
  STATE.keepForm = true;
  render();
}

function select(name, options, value, label) {
  return h("label", {}, label + " ",
    h("select", { name },
      options.map(([v, text]) => h("option", { value: v, selected: v === value }, text))));
}

function filterForm(params) {
  const runs = STATE.runs;
  const conditions = new Set(params.getAll("condition").flatMap((v) => v.split(",")));
  const form = h("form", { id: "filters", onsubmit: (e) => e.preventDefault() },
    runs.length > 1
      ? select("run", [["", "all"], ...runs.map((r) => [String(r.id), r.name])],
          params.get("run") || "", "run")
      : null,
    h("fieldset", { class: "conditions" }, h("legend", {}, "condition"),
      STATE.facets.conditions.map((c) => h("label", {},
        h("input", { type: "checkbox", name: "condition", value: c, checked: conditions.has(c) }),
        " " + c))),
    select("language", [["", "any"], ...STATE.facets.languages.map((l) => [l, l])],
      params.get("language") || "", "language"),
    select("removed", [["", "any"], ...STATE.facets.removed.map((c) => [c, c])],
      params.get("removed") || "", "removed constraint"),
    select("failed", [["", "any"], ["1", "failed"], ["0", "not failed"]],
      params.get("failed") || "", "failure"),
    select("all_unknown", [["", "any"], ["1", "all unknown"], ["0", "some answered"]],
      params.get("all_unknown") || "", "answers"),
    h("label", {}, "score ",
      h("input", { type: "number", name: "score_min", min: 0, max: 100, step: "any",
        placeholder: "min", value: params.get("score_min") || "" }),
      " – ",
      h("input", { type: "number", name: "score_max", min: 0, max: 100, step: "any",
        placeholder: "max", value: params.get("score_max") || "" })),
    h("label", {}, "instance ",
      h("input", { type: "search", name: "q", placeholder: "id contains…",
        value: params.get("q") || "" })),
    select("limit", [["50", "50"], ["100", "100"], ["200", "200"]],
      params.get("limit") || "50", "per page"),
    // Only a run resumed narrower stores records its config.yaml (and report) leaves out.
    runs.some((r) => r.ignored && r.ignored.total) || params.get("scope")
      ? select("scope", [["", "in config.yaml (as the report)"], ["out", "outside config.yaml"],
          ["all", "all stored"]], params.get("scope") || "", "records")
      : null,
    h("a", { href: "#/", class: "reset" }, "reset"));
  const apply = () => {
    const next = new URLSearchParams();
    const data = new FormData(form);
    for (const [key, value] of data.entries()) if (value !== "") next.append(key, String(value));
    for (const key of ["sort", "order"]) if (params.get(key)) next.set(key, params.get(key));
    go(next);
  };
  form.addEventListener("change", apply);
  form.addEventListener("input", (event) => {
    if (event.target.type !== "search" && event.target.type !== "number") return;
    clearTimeout(STATE.indexTimer);
    STATE.indexTimer = setTimeout(apply, 300);
  });
  return form;
}

function recordsTable(params, page) {
  const sort = params.get("sort") || "instance";
  const order = params.get("order") || "asc";
  const head = h("tr", {}, COLUMNS.map(([key, label]) => {
    if (!key) return h("th", {}, label);
    const next = new URLSearchParams(params);
    next.set("sort", key);
    next.set("order", sort === key && order === "asc" ? "desc" : "asc");
    next.delete("offset");
    const arrow = sort === key ? (order === "asc" ? " ▲" : " ▼") : "";
    return h("th", { class: "sortable", "aria-sort": sort === key ? order + "ending" : null },
      h("a", { href: "#/?" + next, data: { sort: key } }, label + arrow));
  }));
  const rows = page.rows.map((row) => h("tr", {
    class: [row.failed ? "failed" : null, row.in_scope === false ? "outside" : null]
      .filter(Boolean).join(" ") || null,
    title: row.in_scope === false ? "outside what config.yaml names: the report ignores it" : null,
  },
    h("td", {}, String(row.run)),
    h("td", { class: "id" }, h("a", { href: sampleHref(row) }, row.instance_id)),
    h("td", {}, row.condition),
    h("td", { class: "num" }, String(row.seed)),
    h("td", {}, row.language),
    h("td", {}, row.removed_constraints.join(", ")),
    h("td", { class: "num score" }, fmt(row.score)),
    h("td", { class: row.all_unknown ? "unknown" : null },
      row.questions ? `${row.questions - row.unknown_answers}/${row.questions} answered` : ""),
    h("td", {}, row.termination),
    h("td", { class: "stage" }, row.failed ? `${row.stage}: ${row.kind}` : ""),
    h("td", { class: "preview" }, row.answer)));
  return h("table", { id: "records" }, h("thead", {}, head), h("tbody", {}, rows));
}

function pager(params, page) {
  const pages = Math.max(1, Math.ceil(page.total / page.limit));
  const current = Math.floor(page.offset / page.limit);
  const link = (n, text) => {
    if (n < 0 || n >= pages || n === current) return h("span", { class: "off" }, text);
    const next = new URLSearchParams(params);
    next.set("offset", String(n * page.limit));
    return h("a", { href: "#/?" + next, class: "page" }, text);
  };
  return h("nav", { class: "pager" },
    link(0, "« first"), link(current - 1, "‹ prev"),
    h("span", { class: "where" }, `page ${current + 1} of ${pages}`),
    link(current + 1, "next ›"), link(pages - 1, "last »"));
}

async function resolveRunPath(params) {
  // A link from report.html names a run by its directory; this viewer numbers its runs.
  const path = params.get("runpath");
  if (!path) return params;
  params.delete("runpath");
  const run = STATE.runs.find((r) => r.path === path);
  if (run) params.set("run", String(run.id));
  else STATE.notice = `This viewer does not serve ${path}: start \`cts view ${path}\`.`;
  history.replaceState(null, "", "#/?" + params);
  return params;
}

async function renderIndex(raw, ticket) {
  const params = indexParams(await resolveRunPath(raw));
  let results = document.getElementById("results");
  const keep = STATE.keepForm && STATE.view === "index" && results;
  STATE.keepForm = false;
  STATE.lastIndex = location.hash || "#/";
  if (!keep) {
    STATE.view = "index";
    results = h("section", { id: "results" });
    const notice = STATE.notice ? h("p", { class: "notice" }, STATE.notice) : null;
    STATE.notice = null;
    show(notice, filterForm(params), results);
  }
  const page = await api("/api/records", params);
  if (ticket !== STATE.ticket) return;
  const first = page.total ? page.offset + 1 : 0;
  results.replaceChildren(
    h("p", { id: "count" },
      `${page.total} record(s) match · showing ${first}–${page.offset + page.rows.length}`),
    recordsTable(params, page),
    pager(params, page));
  rendered("index");
}

// -- a sample ----------------------------------------------------------------------------------

function section(title, ...body) {
  return h("section", { class: "part" }, h("h3", {}, title), body);
}

function field(name, value, cls) {
  return h("div", { class: "field " + (cls || "") }, h("span", { class: "name" }, name),
    value instanceof Node ? value : pre(value));
}

function scoresLine(record) {
  const s = record.scores || {};
  const usage = record.usage || {};
  return h("p", { class: "facts" },
    h("span", { class: "score big" }, "restore " + fmt(s.restore_score_100)),
    ` strict ${fmt(s.strict)} · unweighted ${fmt(s.unweighted)} · termination `
      + `${record.termination || "–"} · language ${record.language || "–"} · removed `
      + `${(record.removed_constraints || []).join(", ") || "–"} · search calls `
      + `${usage.search_llm_calls ?? "–"} · ${record.seconds} s`);
}

function errorBox(error) {
  if (!error) return null;
  return h("div", { class: "error-box" },
    h("strong", {}, `failed at stage ${error.stage || "?"} (${error.kind || "?"})`),
    pre(error.message || ""),
    error.traceback ? h("details", {}, h("summary", {}, "traceback"), pre(error.traceback)) : null);
}

function queries(sample) {
  const record = sample.record;
  const instance = sample.instance;
  return section("Queries",
    instance ? field("blurred query", instance.blurred_query) : null,
    instance ? field("fused query", instance.fused_query) : null,
    sample.instance_error ? h("p", { class: "notice" }, sample.instance_error) : null,
    record.rewrite !== null && record.rewrite !== undefined
      ? field("rewrite", record.rewrite, "rewrite") : null,
    field("search query", record.search_query));
}

function dialogue(sample) {
  if (!sample.dialogue.length) {
    return section("Clarification", h("p", { class: "muted" }, "no clarification (this condition asks none)"));
  }
  const rows = sample.dialogue.map((turn, i) => h("tr", {},
    h("td", { class: "num" }, String(i + 1)),
    h("td", { class: "question" }, turn.question),
    h("td", { class: "types" }, (turn.question_types || []).join(", ") || "–"),
    h("td", { class: turn.unknown ? "answer unknown" : "answer" },
      turn.answer === null ? "(no answer)" : turn.answer)));
  return section("Clarification",
    h("table", { class: "dialogue" },
      h("thead", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, "question"), h("th", {}, "type"),
        h("th", {}, "answer"))),
      h("tbody", {}, rows)),
    sample.record.stopped_early ? h("p", { class: "muted" }, "the clarifier stopped early") : null);
}

function observationView(obs) {
  if (!obs) return null;
  if (obs.kind === "protocol_error") {
    return h("div", { class: "obs protocol" }, h("h4", {}, "protocol error"), pre(obs.message));
  }
  const parts = [h("h4", {}, `${obs.tool} result` + (obs.cached ? " (tool cache)" : ""))];
  for (const block of obs.searches || []) {
    parts.push(h("div", { class: "search" },
      block.query !== null ? h("p", { class: "query" }, "query: ", h("q", {}, block.query)) : null,
      block.hits.length
        ? h("ol", { class: "hits" }, block.hits.map((hit) => h("li", {},
            hit.doc_id ? h("span", { class: "doc" }, hit.doc_id) : null,
            h("span", { class: "title" }, hit.title),
            h("span", { class: "url" }, hit.url),
            hit.date ? h("span", { class: "date" }, hit.date) : null,
            hit.snippet ? h("p", { class: "snippet" }, hit.snippet) : null)))
        : pre(block.text)));
  }
  for (const page of obs.pages || []) {
    parts.push(page.url === null ? pre(page.text) : h("div", { class: "page" },
      h("p", {}, page.doc_id ? h("span", { class: "doc" }, page.doc_id) : null,
        h("span", { class: "url" }, page.url)),
      h("p", { class: "goal" }, "goal: " + page.goal),
      page.error ? h("p", { class: "error-line" }, "could not be read: " + page.error) : null,
      field("evidence", page.evidence, "evidence"),
      field("summary", page.summary, "summary")));
  }
  const errors = Object.entries(obs.errors || {});
  if (errors.length && !(obs.pages || []).length) {
    parts.push(h("ul", { class: "errors" }, errors.map(([k, v]) => h("li", {}, `${k}: ${v}`))));
  }
  parts.push(h("details", {}, h("summary", {}, "raw tool response"), pre(obs.text)));
  return h("div", { class: "obs" }, parts);
}

function rawTraceLink(sample) {
  return h("a", { href: sample.raw.trace, target: "_blank", rel: "noopener" }, "raw trace");
}

function traceView(sample) {
  if (!sample.trace) {
    // A trace too large (or too deep) to read here can still be opened whole.
    const file = sample.record.trace_id && /^trace file (over|unreadable)/.test(sample.trace_error || "");
    return section("Search trace", h("p", { class: "notice" }, sample.trace_error || "no trace",
      file ? [" · ", rawTraceLink(sample)] : null));
  }
  const trace = sample.trace;
  const turns = trace.turns.map((turn, i) => h("li", { class: "turn" },
    h("div", { class: "turn-head" },
      `turn ${i + 1}`
      + (turn.final ? " · forced final turn" : "")
      + (turn.cached ? " · from the response cache" : "")
      + (turn.prompt_tokens !== undefined && turn.prompt_tokens !== null
        ? ` · ${turn.prompt_tokens} + ${turn.completion_tokens} tokens` : "")),
    turn.reasoning ? field("reasoning", turn.reasoning, "reasoning") : null,
    turn.tool_call ? h("div", { class: "call" }, h("h4", {}, "tool call: " + turn.tool_call.name),
      json(turn.tool_call.arguments)) : null,
    turn.answer !== null && turn.answer !== undefined ? field("answer", turn.answer, "turn-answer") : null,
    turn.protocol_error ? h("div", { class: "obs protocol" }, h("h4", {}, "unreadable turn"),
      pre(turn.protocol_error.message), pre(turn.protocol_error.raw)) : null,
    turn.text ? h("details", {}, h("summary", {}, "raw model output"), pre(turn.text)) : null,
    observationView(turn.observation)));
  return section("Search trace",
    sample.trace_error ? h("p", { class: "notice" }, sample.trace_error) : null,
    h("p", { class: "muted" }, `${trace.llm_calls ?? "?"} model call(s), termination `
      + `${trace.termination}` + (trace.error ? ` · ${trace.error}` : "")),
    h("ol", { class: "trace" }, turns));
}

function answerView(sample) {
  const answer = h("div", { class: "answer-text", id: "answer" });
  for (const segment of sample.answer_segments) {
    if (!segment.nuggets.length) answer.append(document.createTextNode(segment.text));
    else {
      answer.append(h("mark", { data: { nuggets: JSON.stringify(segment.nuggets) },
        title: "quoted for " + segment.nuggets.join(", ") }, segment.text));
    }
  }
  if (!sample.answer_segments.length) answer.append(h("span", { class: "muted" }, "(empty)"));
  return section("Final answer", answer);
}

function nuggetsView(sample, root) {
  if (!sample.nuggets.length) {
    return section("Nuggets", h("p", { class: "muted" }, "no judged nuggets"));
  }
  const marked = new Set(sample.answer_segments.flatMap((segment) => segment.nuggets));
  const rows = sample.nuggets.map((n) => {
    const quote = n.evidence || "";
    const found = marked.has(n.id);
    const row = h("tr", { class: "nugget", data: { nugget: n.id } },
      h("td", { class: "id" }, n.id),
      h("td", {}, n.text === null ? h("span", { class: "muted" }, "(not in the dataset)") : n.text),
      h("td", { class: "num" }, n.weight === null ? "–" : String(n.weight)),
      h("td", {}, labelBadge(n.label)),
      h("td", { class: "quote" }, quote ? h("q", {}, quote) : "–",
        found ? h("span", { class: "found" }, " in answer") : null));
    const toggle = (on) => {
      for (const mark of root.querySelectorAll("mark")) {
        if (JSON.parse(mark.dataset.nuggets).includes(n.id)) mark.classList.toggle("hot", on);
      }
    };
    row.addEventListener("mouseenter", () => toggle(true));
    row.addEventListener("mouseleave", () => toggle(false));
    return row;
  });
  return section("Nuggets",
    h("table", { class: "nuggets" },
      h("thead", {}, h("tr", {}, ["id", "nugget", "weight", "label", "judge's quote"].map(
        (t) => h("th", {}, t)))),
      h("tbody", {}, rows)));
}

function sampleBody(sample) {
  const root = h("div", { class: "sample" });
  const record = sample.record;
  append(root,
    h("h2", {}, h("span", { class: "id" }, record.instance_id), ` · ${record.condition} · seed `
      + `${record.seed}`),
    h("p", { class: "run-name" }, sample.run.name),
    scoresLine(record),
    sample.cut ? h("p", { class: "notice cut" },
      "Some texts here are too long to show whole: each is cut where it says so, with its "
      + "length. Whole: ", h("a", { href: sample.raw.record, target: "_blank", rel: "noopener" },
        "raw record"),
      record.trace_id ? [" · ", rawTraceLink(sample)] : null) : null,
    sample.scope_note ? h("p", { class: "notice scope" }, sample.scope_note) : null,
    errorBox(record.error),
    queries(sample),
    dialogue(sample),
    answerView(sample),
    nuggetsView(sample, root),
    traceView(sample));
  return root;
}

function keyLinks(keys, current) {
  return h("nav", { class: "keys" }, "this instance: ", keys.map((k) => {
    const same = current && k.run === current.run && k.condition === current.condition
      && k.seed === current.seed;
    const text = `${STATE.runs.length > 1 ? "run " + k.run + " " : ""}${k.condition} s${k.seed} `
      + (k.failed ? "failed" : fmt(k.score));
    return same ? h("span", { class: "key current" }, text)
      : h("a", { class: "key" + (k.failed ? " failed" : ""), href: sampleHref(k) }, text);
  }));
}

function compareChoices(keys, current) {
  // Default partner: the same key in another run, else blurred (or the first other condition).
  const others = keys.filter((k) => !(k.run === current.run && k.condition === current.condition
    && k.seed === current.seed));
  const options = others.map((k) => h("option", {
    value: JSON.stringify([k.run, k.condition, k.seed]),
  }, `${runName(k.run)} · ${k.condition} · seed ${k.seed}`));
  if (!options.length) return null;
  const chooser = h("select", { id: "compare-with" }, options);
  const preferred = others.find((k) => k.run !== current.run && k.condition === current.condition
    && k.seed === current.seed) || others.find((k) => k.run === current.run && k.seed === current.seed
    && k.condition === "blurred") || others[0];
  chooser.value = JSON.stringify([preferred.run, preferred.condition, preferred.seed]);
  const button = h("button", { type: "button", id: "compare-go", onclick: () => {
    const [run, condition, seed] = JSON.parse(chooser.value);
    location.hash = route("/compare", {
      instance: current.instance_id,
      a_run: current.run, a_condition: current.condition, a_seed: current.seed,
      b_run: run, b_condition: condition, b_seed: seed,
    });
  } }, "compare side by side");
  return h("p", { class: "compare" }, "compare with ", chooser, " ", button);
}

function keyOf(params, prefix) {
  const key = {
    run: Number(params.get(prefix + "run")),
    instance_id: params.get("instance"),
    condition: params.get(prefix + "condition"),
    seed: Number(params.get(prefix + "seed")),
  };
  return key;
}

function sampleParams(key) {
  return { run: key.run, instance: key.instance_id, condition: key.condition, seed: key.seed };
}

async function renderSample(params, ticket) {
  const key = keyOf(params, "");
  const [sample, keys] = await Promise.all([
    api("/api/sample", sampleParams(key)),
    api("/api/instance", { instance: key.instance_id }),
  ]);
  if (ticket !== STATE.ticket) return;
  STATE.view = "sample";
  show(
    h("p", { class: "crumbs" }, h("a", { href: STATE.lastIndex || "#/" }, "← index")),
    keyLinks(keys.records, key),
    compareChoices(keys.records, key),
    sampleBody(sample));
  rendered("sample");
}

async function renderCompare(params, ticket) {
  const a = keyOf(params, "a_");
  const b = keyOf(params, "b_");
  const [left, right] = await Promise.all([
    api("/api/sample", sampleParams(a)).catch((e) => e),
    api("/api/sample", sampleParams(b)).catch((e) => e),
  ]);
  if (ticket !== STATE.ticket) return;
  STATE.view = "compare";
  const column = (s) => h("div", { class: "column" }, s instanceof Error ? failure(s) : sampleBody(s));
  show(
    h("p", { class: "crumbs" }, h("a", { href: STATE.lastIndex || "#/" }, "← index"), " · ",
      h("a", { href: sampleHref(a) }, "left alone"), " · ",
      h("a", { href: sampleHref(b) }, "right alone")),
    h("div", { class: "side-by-side" }, column(left), column(right)));
  rendered("compare");
}

// -- start -------------------------------------------------------------------------------------

async function start() {
  try {
    const runs = await api("/api/runs");
    STATE.runs = runs.runs;
    STATE.facets = runs.facets;
    const broken = STATE.runs.filter((r) => r.config_error);
    if (broken.length) STATE.notice = broken.map((r) => `${r.path}: ${r.config_error}`).join("\n");
    document.getElementById("runs-line").replaceChildren(
      ...STATE.runs.map((r) => h("span", { class: "run", title: r.path },
        `${r.id}: ${r.name} — ${r.records} records, ${r.failed} failed`
        + (r.ignored && r.ignored.total
          ? `, ${r.ignored.total} more stored outside config.yaml (ignored by the report)` : ""))));
  } catch (error) {
    show(failure(error));
    return;
  }
  window.addEventListener("hashchange", render);
  await render();
}

start();
