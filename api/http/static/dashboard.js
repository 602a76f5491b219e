// The jobs page: poll the farm's state every second and redraw the tables in place.
"use strict";
(function () {
  const DONE = new Set(["completed", "failed", "cancelled"]);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k === "style") node.style.cssText = v;
      else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c));
    return node;
  }
  const fmt = (v, digits) => (v === null || v === undefined ? "–" : v.toFixed(digits));
  // A duration as people read one (the server's `duration` filter does the same).
  function duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    const pad = (n) => String(n).padStart(2, "0");
    if (s >= 3600) return `${Math.floor(s / 3600)}h${pad(Math.floor((s % 3600) / 60))}m`;
    if (s >= 60) return `${Math.floor(s / 60)}m${pad(s % 60)}s`;
    return `${s}s`;
  }

  function jobRow(j) {
    const c = j.request_counts;
    const done = c.completed + c.failed;
    const pct = c.total ? (100 * done) / c.total : 0;
    return el("tr", {"data-job": j.id, class: DONE.has(j.status) ? "done" : ""},
      el("td", {}, el("a", {href: window.APPLESPEC.job + encodeURIComponent(j.id)}, j.id)),
      el("td", {}, j.model),
      el("td", {}, el("span", {class: "status " + j.status}, j.status)),
      el("td", {},
        el("div", {class: "bar"}, el("div", {class: "fill", style: `width: ${pct}%`})),
        el("span", {class: "progress-text"}, `${done}/${c.total}`)),
      el("td", {class: "eta"}, duration(j.eta_s)),
      el("td", {}, String(c.failed)),
      el("td", {}, fmt(j.tokens_per_s, 1)),
      el("td", {}, fmt(j.acceptance_rate, 2)),
      el("td", {class: "energy", title: "NVML or RAPL; – where not measured"},
        j.energy_j === null || j.energy_j === undefined ? "–" : `${j.energy_j.toFixed(1)} J`),
      el("td", {}, j.created_at.slice(0, 19).replace("T", " ")));
  }

  function render(state) {
    const jobs = document.getElementById("jobs");
    jobs.replaceChildren(...(state.jobs.length ? state.jobs.map(jobRow)
      : [el("tr", {class: "empty"}, el("td", {colspan: "10"}, "no jobs yet"))]));
    const workers = document.getElementById("workers");
    workers.replaceChildren(...(state.workers.length
      ? state.workers.map((w) => el("li", {}, el("b", {}, w.name), " ",
          el("span", {class: "queues"}, w.queues.join(", "))))
      : [el("li", {class: "empty"},
          state.workers_checked_at === null ? "checking the broker…" : "no worker answers")]));
    document.getElementById("worker-count").textContent = String(state.workers.length);
    document.getElementById("broker-error").textContent = state.broker_error || "";
    const queues = document.getElementById("queues");
    queues.replaceChildren(...(state.queues.length
      ? state.queues.map((q) => el("tr", {}, el("td", {}, q.model), el("td", {}, String(q.pending)),
          el("td", {}, String(q.running)), el("td", {}, q.chunks === null ? "–" : String(q.chunks)),
          el("td", {}, String(q.workers))))
      : [el("tr", {class: "empty"}, el("td", {colspan: "5"}, "nothing queued"))]));
  }

  const live = document.getElementById("live");
  async function poll() {
    try {
      const response = await fetch(window.APPLESPEC.state, {cache: "no-store"});
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      render(await response.json());
      live.className = "live";
      live.title = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      live.className = "live stale";
      live.title = "cannot reach the server: " + e;
    }
    setTimeout(poll, 1000);
  }
  setTimeout(poll, 1000);
})();
