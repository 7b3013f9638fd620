// The operator page: follows /v1/events (read with fetch, so the bearer token can be sent),
// shows the selected run and its actor tree, and stops, cancels or resumes it.
"use strict";

const TOKEN_KEY = "runvisor-token";
const RETRY_MS = 2000;
const TREE_POLL_MS = 1000;
const LIVE = new Set(["running", "awaiting_input", "orphaned"]);

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  runs: [],
  selected: null, // the selected run's row, as GET /v1/runs/{run_id} answers it
  tokenWaiters: [],
};

const $ = (id) => document.getElementById(id);

// An element with attributes and children (strings become text: nothing is parsed as HTML).
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

class Unauthorized extends Error {}

class ApiFailure extends Error {
  constructor(status, error) {
    super(error && error.code ? `${error.code}: ${error.message}` : `HTTP ${status}`);
  }
}

// A call to the API with the token; a 401 asks for the token.
async function api(path, options = {}) {
  const headers = new Headers(options.headers);
  if (state.token) headers.set("Authorization", `Bearer ${state.token}`);
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    askToken();
    throw new Unauthorized("the token is needed");
  }
  return response;
}

async function json(path, body) {
  const options = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  };
  const response = await api(path, options);
  const data = await response.json();
  if (!response.ok) throw new ApiFailure(response.status, data.error);
  return data;
}

function askToken() {
  $("token-form").hidden = false;
  $("token").focus();
}

function tokenGiven() {
  return new Promise((resolve) => state.tokenWaiters.push(resolve));
}

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.token = $("token").value;
  sessionStorage.setItem(TOKEN_KEY, state.token);
  $("token-form").hidden = true;
  state.tokenWaiters.splice(0).forEach((resolve) => resolve());
  if (state.selected) select(state.selected.run_id);
});

// --- the event stream ---------------------------------------------------------------------

// Server-sent events from a fetch body: blocks separated by a blank line.
async function* sse(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) name = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { name, data: JSON.parse(data.join("\n")) };
    }
  }
}

async function follow() {
  for (;;) {
    try {
      const response = await api("/v1/events", { headers: { Accept: "text/event-stream" } });
      if (!response.ok) throw new ApiFailure(response.status, (await response.json()).error);
      $("connection").textContent = "live";
      for await (const event of sse(response)) dispatch(event);
      $("connection").textContent = "disconnected: reconnecting…";
    } catch (error) {
      if (error instanceof Unauthorized) {
        $("connection").textContent = "waiting for the token";
        await tokenGiven();
        continue;
      }
      $("connection").textContent = `disconnected (${error.message}): reconnecting…`;
    }
    await new Promise((resolve) => setTimeout(resolve, RETRY_MS));
  }
}

function dispatch({ name, data }) {
  if (name === "runs") {
    state.runs = data.runs;
    renderRuns();
    const row = state.selected && state.runs.find((r) => r.run_id === state.selected.run_id);
    if (row && row.status !== state.selected.status) select(row.run_id);
  } else if (name === "run") {
    if (state.selected && data.run_id === state.selected.run_id) select(data.run_id);
  } else if (name === "error") {
    $("connection").textContent = `live, but the runs cannot be listed: ${data.error.message}`;
  }
}

// --- the list of runs ---------------------------------------------------------------------

const time = (ms) => new Date(ms).toLocaleTimeString();

function duration(run) {
  const seconds = Math.max(0, ((run.finished_at_ms || Date.now()) - run.started_at_ms) / 1000);
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const minutes = Math.floor(seconds / 60);
  return `${minutes} min ${Math.floor(seconds % 60)} s`;
}

function labels(run) {
  const parts = [["app", run.app_id], ["chat", run.chat_id], ["task", run.task_id], ["user", run.user_id]];
  return parts.filter(([, v]) => v).map(([k, v]) => `${k} ${v}`).join(", ");
}

function status(value) {
  return el("span", { class: `status status-${value}` }, value);
}

function renderRuns() {
  const rows = state.runs.map((run) => el("tr", {
      "data-run": run.run_id,
      class: state.selected && state.selected.run_id === run.run_id ? "selected" : "",
    },
    el("td", {}, el("button", {
      type: "button",
      "aria-label": `Show run ${run.run_id}`,
      onclick: () => select(run.run_id),
    }, `…${run.run_id.slice(-8)}`)),
    el("td", { class: "status-cell" }, status(run.status)),
    el("td", {}, run.workflow_id),
    el("td", { class: "mono" }, run.thread),
    el("td", {}, labels(run)),
    el("td", { class: "mono" }, run.worker || "", run.worker && !run.worker_alive ? " (gone)" : ""),
    el("td", {}, time(run.started_at_ms)),
    el("td", { class: "duration" }, duration(run)),
  ));
  $("runs").tBodies[0].replaceChildren(...rows);
  $("no-runs").hidden = state.runs.length > 0;
}

// --- the selected run ---------------------------------------------------------------------

async function select(runId) {
  try {
    const run = await json(`/v1/runs/${runId}`);
    const first = !state.selected || state.selected.run_id !== runId;
    state.selected = run;
    if (first) $("result").replaceChildren();
    renderRun(run);
    renderRuns();
    await loadTree();
  } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error);
  }
}

function renderRun(run) {
  $("run").hidden = false;
  $("run-title").textContent = `Run ${run.run_id}`;
  const fields = [
    ["Status", status(run.status)],
    ["Workflow", run.workflow_id],
    ["Thread", run.thread],
    ["Labels", labels(run) || "none"],
    ["Worker", run.worker || "unknown"],
    ["Started", new Date(run.started_at_ms).toLocaleString()],
    ["Duration", duration(run)],
    ["Running now", (run.nodes || []).join(", ") || "nothing"],
  ];
  $("run-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const live = LIVE.has(run.status);
  $("stop").disabled = !live;
  $("force").disabled = !live;
  $("cancel").disabled = !live;
  // An answered run's thread went on without it: nothing of it is left to resume.
  $("resume").disabled = ["running", "succeeded", "answered"].includes(run.status);
  if (run.outcome && run.outcome.stop && !$("result").hasChildNodes()) showOutcome(run.outcome);
}

async function loadTree() {
  const run = state.selected;
  if (!run) return;
  if (run.status !== "running") {
    $("tree").replaceChildren(el("p", { class: "note" }, `No live actors: the run is ${run.status}.`));
    return;
  }
  try {
    const tree = await json(`/v1/runs/${run.run_id}/tree`);
    if (state.selected && state.selected.run_id === run.run_id) {
      $("tree").replaceChildren(el("ul", {}, treeNode(tree)));
    }
  } catch (error) {
    if (!(error instanceof Unauthorized)) {
      $("tree").replaceChildren(el("p", { class: "note" }, error.message));
    }
  }
}

function treeNode(actor) {
  const notes = [];
  if (actor.iteration !== undefined) notes.push(`iteration #${actor.iteration}`);
  if (actor.items && actor.items.length) notes.push(`items ${actor.items.join(", ")}`);
  return el("li", { "data-kind": actor.kind, "data-node": actor.node_id || "" },
    el("span", { class: "kind" }, actor.kind), " ",
    actor.node_id ? el("code", {}, actor.path || actor.node_id) : null, " ",
    el("span", { class: "note" }, [actor.status, ...notes].join(" · ")),
    actor.children.length ? el("ul", {}, ...actor.children.map(treeNode)) : null,
  );
}

// --- the actions --------------------------------------------------------------------------

function showError(error) {
  $("result").replaceChildren(el("p", { class: "error" }, error.message));
}

function showOutcome(outcome) {
  const list = (nodes) => (nodes && nodes.length ? nodes.join(", ") : "none");
  const rows = [["Status", status(outcome.status)]];
  if (outcome.stop) {
    const stop = outcome.stop;
    rows.push(
      ["Reason", stop.reason],
      ["Stopped at", list(stop.stopped_at)],
      ["Finished", list(stop.finished)],
      ["Resumes at", list(stop.frontier)],
      ["Aborted (force)", list(stop.forced)],
      ["Checkpoint", stop.checkpoint_id || stop.checkpoint_error || "none"],
    );
    if (stop.partial_response) rows.push(["Partial response", stop.partial_response]);
  }
  if (outcome.error) rows.push(["Error", outcome.error]);
  $("result").replaceChildren(
    el("h3", {}, "Stop result"),
    el("dl", { class: "stop-result" }, ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
  );
}

async function act(button, path, body, then) {
  const run = state.selected;
  if (!run) return;
  button.disabled = true;
  $("result").replaceChildren(el("p", { class: "note" }, `${button.textContent}…`));
  try {
    then(await json(path(run), body), run);
  } catch (error) {
    if (!(error instanceof Unauthorized)) showError(error);
  } finally {
    await select(state.selected.run_id);
  }
}

const stopped = (outcome) => showOutcome(outcome);

$("stop").addEventListener("click", (e) =>
  act(e.currentTarget, (r) => `/v1/runs/${r.run_id}/stop`, { mode: "graceful" }, stopped));
$("force").addEventListener("click", (e) =>
  act(e.currentTarget, (r) => `/v1/runs/${r.run_id}/stop`, { mode: "force" }, stopped));
$("cancel").addEventListener("click", (e) =>
  act(e.currentTarget, (r) => `/v1/runs/${r.run_id}/cancel`, {}, stopped));
$("resume").addEventListener("click", (e) =>
  act(e.currentTarget, (r) => `/v1/threads/${encodeURIComponent(r.thread)}/resume`, {}, (started) => {
    state.selected = { run_id: started.run_id };
    $("result").replaceChildren(el("p", {}, `Resumed as run ${started.run_id}.`));
  }));

setInterval(() => {
  for (const cell of document.querySelectorAll("#runs td.duration")) {
    const run = state.runs.find((r) => r.run_id === cell.parentElement.dataset.run);
    if (run) cell.textContent = duration(run);
  }
  if (state.selected && state.selected.status === "running") loadTree();
}, TREE_POLL_MS);

follow();
