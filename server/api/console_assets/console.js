// The live console: polls /console/data.json once a second and draws its series with uPlot.
"use strict";

const POLL_MS = 1000;
const KEEP_S = 900;
const COLOURS = ["#2f6fdf", "#e0a030", "#d64545", "#3a9d5d", "#8e5bd6"];

const seconds = (v) => v < 1 ? `${(v * 1000).toFixed(0)} ms` : `${v.toFixed(2)} s`;
const bytes = (v) => v >= 2 ** 30 ? `${(v / 2 ** 30).toFixed(2)} GiB` : `${(v / 2 ** 20).toFixed(1)} MiB`;
const percent = (v) => `${(v * 100).toFixed(Math.abs(v) < 0.1 ? 2 : 1)}%`;
const number = (v) => Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(2);

// id, panel, title, [field, label] pairs, the value format, and the indicator that colours it.
const CHARTS = [
  ["requests", "service", "Requests/s by status", [["requests_2xx", "2xx"], ["requests_4xx", "4xx"], ["requests_5xx", "5xx"]], number, "server_error_share"],
  ["load", "service", "Running and waiting", [["running", "running"], ["waiting", "waiting"]], number, "waiting"],
  ["ttft", "service", "Time to first token", [["ttft_p50", "P50"], ["ttft_p90", "P90"], ["ttft_p99", "P99"]], seconds, "ttft_slo"],
  ["itl", "service", "Inter-token latency", [["itl_p50", "P50"], ["itl_p90", "P90"], ["itl_p99", "P99"]], seconds, "itl_slo"],
  ["queue", "service", "Queue time", [["queue_p50", "P50"], ["queue_p95", "P95"], ["queue_p99", "P99"]], seconds, "queue_time_over_p95_line_share"],
  ["batch", "service", "Batch size (sequences)", [["batch_seqs_p50", "P50"], ["batch_seqs_max", "max"]], number, null],
  ["batch_tokens", "service", "Batch size (tokens)", [["batch_tokens_p50", "P50"], ["batch_tokens_max", "max"]], number, null],
  ["kv", "service", "KV cache use, prefix-cache hits", [["kv_usage", "KV used"], ["prefix_hit_rate", "prefix hits"]], percent, "kv_usage"],
  ["trouble", "service", "Preemptions and errors /s", [["preemptions", "preemptions"], ["errors", "errors"]], number, "preemptions_per_minute"],
  ["tokens", "model", "Tokens/s", [["output_tokens", "output"], ["prompt_tokens", "prompt"]], number, null],
  ["speed", "model", "Decode speed per request (tokens/s)", [["decode_speed_p50", "P50"]], number, null],
  ["length", "model", "Output length (tokens)", [["output_len_p50", "P50"], ["output_len_max", "max"]], number, null],
  ["finished", "model", "Finished/s", [["finished", "all"], ["finished_length", "by length"]], number, "length_finish_share"],
  ["quality", "model", "Repetition and anomalies", [["repetition_mean", "repetition ratio"], ["anomalies", "anomalies/s"]], number, "repetition_loop_share"],
  ["spec", "model", "Speculative acceptance", [["spec_acceptance", "accepted"]], percent, null],
  ["cpu", "infrastructure", "Host CPU", [["host_cpu", "busy"]], percent, null],
  ["memory", "infrastructure", "Memory", [["host_memory_used", "host used"], ["rss_bytes", "server RSS"]], bytes, null],
];
// Charts that only mean something on some servers (speculative decoding, GPUs) are drawn once data comes.
const OPTIONAL = new Set(["spec"]);

let key = sessionStorage.getItem("vigil-console-key");
let last = null;
let t = [];
let series = {};
const charts = {};

function gpuCharts(fields) {
  const gpus = new Set(fields.filter((f) => /^gpu\d+_/.test(f)).map((f) => f.split("_")[0]));
  return [...gpus].flatMap((gpu) => [
    [`${gpu}_temp`, "infrastructure", `${gpu.toUpperCase()} temperature (°C)`, [[`${gpu}_temperature`, "°C"]], number, `${gpu}_temperature`],
    [`${gpu}_util`, "infrastructure", `${gpu.toUpperCase()} utilisation, throttled`, [[`${gpu}_utilization`, "busy"], [`${gpu}_throttled`, "throttled"]], percent, null],
    [`${gpu}_mem`, "infrastructure", `${gpu.toUpperCase()} memory`, [[`${gpu}_memory_used`, "used"]], bytes, null],
    [`${gpu}_power`, "infrastructure", `${gpu.toUpperCase()} power (W)`, [[`${gpu}_power`, "W"]], number, null],
  ]);
}

function el(tag, attrs = {}, text = "") {
  const node = document.createElement(tag);
  Object.entries(attrs).forEach(([k, v]) => node.setAttribute(k, v));
  node.textContent = text;
  return node;
}

function ensureChart([id, panel, title, fields, format, indicator]) {
  if (charts[id]) return charts[id];
  const box = el("div", { class: "chart", "data-chart": id, "data-points": "0" });
  const head = el("div", { class: "title" }, title);
  const latest = el("span", { class: "latest" }, "no data yet");
  head.appendChild(latest);
  box.appendChild(head);
  document.querySelector(`#panel-${panel} .charts`).appendChild(box);
  const plot = new uPlot({
    width: 330, height: 150, legend: { live: false },
    series: [{}, ...fields.map(([, label], i) => ({
      label, stroke: COLOURS[i % COLOURS.length], width: 1.5, spanGaps: false,
      value: (u, v) => v == null ? "–" : format(v),
    }))],
    axes: [{}, { size: 72, values: (u, vals) => vals.map((v) => v == null ? "" : format(v)) }],
  }, [[], ...fields.map(() => [])], box);
  charts[id] = { box, latest, plot, fields, format, indicator };
  return charts[id];
}

function draw(data) {
  const all = [...CHARTS, ...gpuCharts(Object.keys(data.series))];
  const states = Object.fromEntries(data.indicators.map((i) => [i.name, i.state]));
  for (const spec of all) {
    const [id, , , fields] = spec;
    const columns = fields.map(([f]) => series[f] || []);
    const points = columns.reduce((n, c) => n + c.filter((v) => v != null).length, 0);
    if (OPTIONAL.has(id) && !points && !charts[id]) continue;
    const chart = ensureChart(spec);
    chart.plot.setData([t, ...columns]);
    chart.box.dataset.points = String(points);
    const latest = columns.map((c, i) => {
      const v = [...c].reverse().find((x) => x != null);
      return v == null ? null : `${fields[i][1]} ${chart.format(v)}`;
    }).filter(Boolean);
    chart.latest.textContent = latest.length ? latest.join(" · ") : "no data yet";
    chart.box.className = `chart ${chart.indicator ? states[chart.indicator] || "ok" : "ok"}`;
  }
}

function drawIndicators(indicators) {
  const box = document.getElementById("indicators");
  box.replaceChildren(...indicators.map((i) => {
    const text = `${i.name.replaceAll("_", " ")}${i.value == null ? "" : ": " + number(i.value)}`;
    const chip = el("span", { class: `chip ${i.state}`, "data-indicator": i.name, "data-state": i.state }, text);
    if (i.alert) chip.title = `${i.alert} would fire if this holds for the rule's for:`;
    return chip;
  }));
}

function describe(rows) {
  const dl = el("dl");
  for (const [name, value] of rows) {
    dl.append(el("dt", {}, name), el("dd", {}, value == null ? "–" : String(value)));
  }
  return dl;
}

function drawRunning(data) {
  const s = data.server;
  const flags = Object.entries(s.flags).filter(([, v]) => v !== false && v !== null)
    .map(([k, v]) => v === true ? k : `${k}=${v}`).join(", ") || "defaults";
  const blocks = [describe([["version", s.version], ["uptime", `${Math.floor(s.uptime_s / 60)} min`], ["flags", flags]])];
  for (const [name, m] of Object.entries(data.models)) {
    const e = m.engine;
    blocks.push(describe([
      ["model", name], ["dtype", `${e.dtype} (weights ${e.weight_dtype})`], ["quantization", e.quantization],
      ["kernels", [e.attention_backend, e.cpu_kernels, e.decode_path, e.linear_kernels].filter(Boolean).join(" / ")],
      ["device", `${e.device}, TP ${e.tensor_parallel_size}`],
      ["KV pool", `${m.kv_cache.num_blocks} blocks × ${m.kv_cache.block_size}, ${bytes(m.kv_cache.total_bytes)} ${m.kv_cache.dtype}`],
      ["max length", m.max_model_len],
    ]));
  }
  document.getElementById("running").replaceChildren(...blocks);
}

function drawTotals(totals) {
  const table = (title, counts) => {
    const box = el("table");
    box.append(el("caption", {}, title));
    const entries = Object.entries(counts);
    const rows = entries.length ? entries : [["none yet", ""]];
    rows.forEach(([k, v]) => { const r = el("tr"); r.append(el("td", {}, k), el("td", {}, String(v))); box.append(r); });
    return box;
  };
  document.querySelector("#panel-service .totals").replaceChildren(table("Errors by reason", totals.errors));
  const model = [table("Finish reasons", totals.finish_reasons), table("Anomalies", totals.anomalies)];
  if (Object.keys(totals.routing).length) model.push(table("Routing decisions", totals.routing));
  document.querySelector("#panel-model .totals").replaceChildren(...model);
}

function drawRequests(rows, traceUrl) {
  document.querySelector("#requests tbody").replaceChildren(...rows.map((r) => {
    const tr = el("tr", { "data-request-id": r.id });
    const trace = el("td");
    if (r.trace_id && traceUrl) {
      trace.append(el("a", { href: traceUrl.replace("{trace_id}", r.trace_id) }, r.trace_id.slice(0, 12)));
    } else trace.textContent = r.trace_id ? r.trace_id.slice(0, 12) : "–";
    tr.append(el("td", {}, r.id), el("td", {}, r.model), el("td", {}, String(r.prompt_tokens)),
      el("td", {}, String(r.output_tokens)), el("td", {}, r.ttft_s == null ? "–" : seconds(r.ttft_s)),
      el("td", {}, r.duration_s == null ? "–" : seconds(r.duration_s)), el("td", {}, r.finish_reason), trace);
    if (r.output != null) tr.title = r.output;
    return tr;
  }));
}

function merge(data) {
  t = t.concat(data.t);
  for (const [name, values] of Object.entries(data.series)) series[name] = (series[name] || []).concat(values);
  const cut = t.findIndex((s) => s > data.now - KEEP_S);
  if (cut > 0) {
    t = t.slice(cut);
    for (const name of Object.keys(series)) series[name] = series[name].slice(cut);
  }
  if (data.t.length) last = data.t[data.t.length - 1];
}

async function poll() {
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const status = document.getElementById("status");
  try {
    const response = await fetch(`/console/data.json${last == null ? "" : `?since=${last}`}`, { headers });
    if (response.status === 401) {
      document.getElementById("key-form").hidden = false;
      status.textContent = "needs an API key";
      return;
    }
    const data = await response.json();
    merge(data);
    draw(data);
    drawIndicators(data.indicators);
    drawRunning(data);
    drawTotals(data.totals);
    drawRequests(data.requests, data.trace_url);
    document.getElementById("ring").textContent = `ring: ${data.ring.capacity_rows} rows of ${data.ring.fields} series `
      + `at 1 s, ${bytes(data.ring.bytes)}; table: last ${data.ring.recent_requests} requests`;
    status.textContent = `updated ${new Date(data.now * 1000).toLocaleTimeString()}`;
    document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  } catch (error) {
    status.textContent = `no answer: ${error.message}`;
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.getElementById("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  key = document.getElementById("key").value;
  sessionStorage.setItem("vigil-console-key", key);
  document.getElementById("key-form").hidden = true;
});
poll();
