// One job's page: draw its figures with Chart.js and refresh them until the job is done.
"use strict";
(function () {
  const DONE = new Set(["completed", "failed", "cancelled"]);
  const COLORS = ["#3b6fd4", "#e0803a", "#46a35e", "#b34ea8", "#8c8c8c", "#c94c4c"];
  const charts = {};
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;

  const range = (n) => Array.from({length: n}, (_, i) => i + 1);
  const fmt = (v, digits, unit) =>
    v === null || v === undefined ? "–" : v.toFixed(digits) + (unit || "");

  function draw(id, config) {
    if (charts[id]) {
      charts[id].data = config.data;
      charts[id].update("none");
    } else {
      charts[id] = new Chart(document.getElementById(id), config);
    }
  }

  function line(labels, datasets, yTitle, yMax) {
    return {
      type: "line",
      data: {labels, datasets: datasets.map((d, i) => ({
        pointRadius: labels.length > 200 ? 0 : 2, borderWidth: 1.5, spanGaps: true,
        borderColor: COLORS[i], backgroundColor: COLORS[i], ...d}))},
      options: {scales: {x: {title: {display: true, text: "item (finish order)"}},
                         y: {beginAtZero: true, max: yMax, title: {display: true, text: yTitle}}}},
    };
  }

  function bar(labels, data, xTitle, yTitle) {
    return {
      type: "bar",
      data: {labels, datasets: [{data, backgroundColor: COLORS[0], maxBarThickness: 90}]},
      options: {plugins: {legend: {display: false}},
                scales: {x: {title: {display: true, text: xTitle}},
                         y: {beginAtZero: true, title: {display: true, text: yTitle}}}},
    };
  }

  function cards(s) {
    const c = s.summary.request_counts, m = s.summary.metrics, t = s.totals;
    const rows = [
      ["requests", `${c.completed + c.failed}/${c.total} done, ${c.failed} failed`],
      ["completion tokens", String(m.completion_tokens)],
      ["tokens/s (wall)", fmt(m.tokens_per_s, 1)],
      ["acceptance", fmt(m.acceptance_rate, 3)],
      ["mean accepted length", fmt(m.mean_accepted_length, 2)],
      ["queue wait (mean / max)", `${fmt(t.mean_queue_wait_s, 2, " s")} / ${fmt(t.max_queue_wait_s, 2, " s")}`],
    ];
    if (t.mean_batch_size !== null) rows.push(["mean batch size", fmt(t.mean_batch_size, 1)]);
    if (m.forced_tokens !== null && m.forced_tokens !== undefined) {
      rows.push(["schema-forced tokens / mask time", `${m.forced_tokens} / ${fmt(m.mask_s, 2, " s")}`]);
    }
    document.getElementById("cards").replaceChildren(...rows.flatMap(([k, v]) => {
      const dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = k;
      dd.textContent = v;
      return [dt, dd];
    }));
  }

  function render(s) {
    const c = s.summary.request_counts;
    const status = document.getElementById("status");
    status.textContent = s.summary.status;
    status.className = "status " + s.summary.status;
    document.getElementById("fill").style.width =
      (c.total ? (100 * (c.completed + c.failed)) / c.total : 0) + "%";
    cards(s);
    const items = s.items, labels = range(items.acceptance.length).map((i) => i * items.bucket);
    draw("chart-acceptance", line(labels, [
      {label: "per item", data: items.acceptance, showLine: false, pointRadius: 1.5},
      {label: "cumulative", data: items.cumulative_acceptance, pointRadius: 0},
    ], "accepted / drafted", 1));
    draw("chart-positions", bar(range(s.per_position.length), s.per_position,
      "draft position", "accepted tokens"));
    const split = s.time_split;
    draw("chart-time", {
      type: "doughnut",
      data: {labels: Object.keys(split).map((k) => `${k} ${split[k].toFixed(2)} s`),
             datasets: [{data: Object.values(split), backgroundColor: COLORS}]},
      options: {plugins: {legend: {position: "right"}}},
    });
    draw("chart-workers", bar(s.workers.map((w) => w.host), s.workers.map((w) => w.tokens_per_s),
      "worker host", "tokens/s"));
    draw("chart-wait", line(labels, [{label: "queue wait", data: items.queue_wait_s}], "seconds"));
    if (items.batch_size) {
      document.getElementById("batch-figure").hidden = false;
      draw("chart-batch", line(labels, [{label: "batch size", data: items.batch_size}], "rows"));
    }
  }

  const live = document.getElementById("live");
  let series = JSON.parse(document.getElementById("series").textContent);
  render(series);
  async function poll() {
    try {
      const response = await fetch(window.APPLESPEC.series, {cache: "no-store"});
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      series = await response.json();
      render(series);
      live.className = "live";
    } catch (e) {
      live.className = "live stale";
      live.title = "cannot reach the server: " + e;
    }
    if (!DONE.has(series.summary.status)) setTimeout(poll, 2000);
    else live.className = "live done";
  }
  if (!DONE.has(series.summary.status)) setTimeout(poll, 2000);
  else live.className = "live done";
})();
