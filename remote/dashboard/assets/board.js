// gpu-train's dashboard: draws the board document (gpu_train/views/board.py), live from its local
// server or from the data a report file carries. No framework: every text goes in as textContent.
"use strict";
(function () {
  const embedded = document.getElementById("board-data");
  const REPORT = embedded ? JSON.parse(embedded.textContent) : null;
  const TOKEN = (document.querySelector('meta[name="gpu-train-csrf"]') || {}).content || "";
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d"];
  const ACTIVE = ["starting", "running"];
  let doc = null;
  let selected = null; // {stack, run} or {stack, sweep}
  let logAt = 0, logKey = "", logLoop = 0;
  let curvesShown = "", curvesAsked = 0;
  const charts = [];

  // -- small helpers ---------------------------------------------------------------------------
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat()) if (kid !== null && kid !== undefined && kid !== false) el.append(kid instanceof Node ? kid : String(kid));
    return el;
  }
  const $ = (id) => document.getElementById(id);
  function money(v, digits) {
    if (v === null || v === undefined) return "–";
    if (v > 0 && v < 0.005 && digits === undefined) return "< $0.01";
    return "$" + v.toFixed(digits === undefined ? 2 : digits);
  }
  // a catalog row's date is a date, or words where its source has none ("derived from S2's g2-standard-8 and L4 rows")
  const asOf = (date) => (/^\d{4}-\d{2}/.test(date || "") ? "as of " + date : "(" + date + ")");
  function duration(s) {
    if (s === null || s === undefined) return "–";
    s = Math.round(s);
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60), hh = Math.floor(m / 60);
    if (hh < 1) return m + " min " + String(s % 60).padStart(2, "0") + " s";
    if (hh < 48) return hh + " h " + String(m % 60).padStart(2, "0") + " min";
    return Math.floor(hh / 24) + " d " + (hh % 24) + " h";
  }
  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
  function ago(t) {
    if (!t) return "never";
    const s = Math.max(0, Date.now() / 1000 - t);
    return s < 90 ? Math.round(s) + " s ago" : duration(s) + " ago";
  }
  const pill = (state, extra) => h("span", { class: "pill " + stateClass(state) + (extra ? " " + extra : "") }, state);
  function stateClass(state) {
    const s = String(state || "").toLowerCase().replace("?", "");
    if (["running", "starting", "reachable", "provisioning", "staging"].some((w) => s.startsWith(w))) return "ok";
    if (["failed", "unreachable", "invalid"].includes(s)) return "bad";
    if (["interrupted", "stopping", "suspending", "repairing"].includes(s)) return "warn";
    if (s === "succeeded") return "done";
    return "off";
  }
  const key = (r) => r.stack + "/" + r.id;

  // -- data ------------------------------------------------------------------------------------
  async function getJSON(path) {
    const res = await fetch(path, { credentials: "same-origin", cache: "no-store" });
    if (!res.ok) throw new Error(path + ": " + res.status);
    return res.json();
  }
  async function act(action, stack, run) {
    const what = action === "vm-stop" ? "stop the VM of " + stack + " (fetching every run first)" : action + " " + run;
    if (!confirm("gpu-train " + what + "?")) return;
    const res = await fetch("api/action", {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-GPU-Train-CSRF": TOKEN },
      body: JSON.stringify({ action, stack, run }),
    });
    const answer = await res.json().catch(() => ({}));
    if (!res.ok) alert(answer.error || "refused: " + res.status);
    refresh();
  }

  async function refresh() {
    try {
      doc = await getJSON("api/board");
      $("freshness").classList.remove("stale");
    } catch (e) {
      $("freshness").textContent = "dashboard not answering (" + e.message + ")";
      $("freshness").classList.add("stale");
      return;
    }
    draw();
  }

  // -- drawing ---------------------------------------------------------------------------------
  function draw() {
    $("project").textContent = doc.project;
    document.title = "gpu-train · " + doc.project;
    $("billing").textContent = doc.billingNow ? "billing now " + money(doc.billingNow) + "/h" : "nothing billing now";
    $("billing").className = doc.billingNow ? "billing on" : "billing";
    $("freshness").textContent = REPORT ? "report of " + when(doc.at) : "live · every " + doc.intervalS + " s · " + ago(doc.at);
    drawWarnings();
    drawStacks();
    drawRuns();
    drawSweeps();
    drawActions();
    drawDetail(false);
    curvesAgain();
    $("footer").textContent =
      "Prices: the catalog's list prices (dates on each stack); this month: VM uptime seen so far × $/h (disks not counted). " +
      "A run's cost: the stack's $/h while it ran, shared with the runs running beside it.";
  }

  function drawWarnings() {
    const box = $("warnings");
    box.replaceChildren(
      ...doc.warnings.map((w) => h("div", { class: "warning " + w.kind }, h("strong", {}, w.stack + ": "), w.text))
    );
    box.hidden = !doc.warnings.length;
  }

  function gpuRow(g) {
    const mem = g.memoryTotalMiB ? (100 * g.memoryUsedMiB) / g.memoryTotalMiB : 0;
    return h(
      "div",
      { class: "gpu" },
      h("span", { class: "gpu-name" }, "GPU " + g.index + " · " + g.name),
      h("span", { class: "bar", title: "utilisation " + g.utilization + " %" }, h("i", { class: "util", style: null, "data-w": g.utilization })),
      h("span", { class: "gpu-num" }, Math.round(g.utilization) + " % util"),
      h("span", { class: "bar", title: "memory" }, h("i", { class: "mem", "data-w": mem })),
      h("span", { class: "gpu-num" }, (g.memoryUsedMiB / 1024).toFixed(1) + " / " + (g.memoryTotalMiB / 1024).toFixed(0) + " GiB")
    );
  }

  function drawStacks() {
    const cards = doc.stacks.map((s) => {
      const nodes = s.nodes.map((n) =>
        h(
          "div",
          { class: "node" },
          h("div", { class: "node-head" }, (s.nodes.length > 1 ? "node " + n.node + " · " : "") + n.host, n.uptimeS ? h("span", { class: "dim" }, " · up " + duration(n.uptimeS)) : null),
          n.error ? h("div", { class: "node-error" }, n.error) : n.gpus.length ? n.gpus.map(gpuRow) : h("div", { class: "dim" }, "no GPU (nvidia-smi not found)")
        )
      );
      const money3 = [
        ["$/h now", s.target === "gcp" ? money(s.hourlyNow) : "–"],
        ["this month", s.spentMonth === null ? "–" : "≥ " + money(s.spentMonth)],
        ["idle stop", s.idle],
      ];
      const price = s.price !== null && s.price !== undefined
        ? h("div", { class: "price" }, money(s.price, 3) + "/h " + (s.way || "") + " · catalog price " + asOf(s.priceDate))
        : s.gcp ? h("div", { class: "price" }, "price unknown (not in the catalog)") : null;
      const canStop = s.gcp && s.billing && !REPORT;
      return h(
        "article",
        { class: "card" + (s.billing ? " billing" : ""), "data-stack": s.stack },
        h("div", { class: "card-head" }, h("h3", {}, s.stack), pill(s.state, "vm")),
        h("div", { class: "sub" }, [s.target, s.shape, s.where].filter(Boolean).join(" · ")),
        h("dl", { class: "figures" }, money3.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v)))),
        price,
        nodes,
        s.notes.length ? h("ul", { class: "notes" }, s.notes.map((n) => h("li", {}, n))) : null,
        h("div", { class: "card-foot" }, h("span", { class: "dim" }, "state " + s.source + (s.polledAt ? " · asked " + (REPORT ? "at " + new Date(s.polledAt * 1000).toLocaleTimeString() : ago(s.polledAt)) : "")),
          canStop ? h("button", { class: "danger", onclick: () => act("vm-stop", s.stack) }, "Stop VM") : null)
      );
    });
    $("stacks").replaceChildren(...(cards.length ? cards : [h("p", { class: "dim" }, "No stack files in this project (gpu-train init writes one).")]));
    for (const bar of document.querySelectorAll(".bar i")) bar.style.width = Math.min(100, Math.max(0, +bar.dataset.w)) + "%";
  }

  function homeCell(r) {
    if (r.home) return h("span", { class: "home yes" }, "✓ fetched");
    if (r.onlyHost && ACTIVE.includes(r.state)) return h("span", { class: "home dim" }, "on host (writing)");
    if (r.onlyHost) return h("span", { class: "home only" }, "only on host");
    return h("span", { class: "home dim" }, "–");
  }

  function drawRuns() {
    const rows = doc.runs.map((r) =>
      h(
        "tr",
        {
          class: "run" + (selected && selected.run === r.id && selected.stack === r.stack ? " selected" : "") + (r.ours ? "" : " other"),
          "data-run": r.id,
          "data-stack": r.stack,
          onclick: () => select({ stack: r.stack, run: r.id }),
        },
        h("td", {}, pill(r.state)),
        h("td", { class: "run-id" }, r.id, r.sweep ? h("span", { class: "tag" }, "sweep " + r.sweep) : null,
          r.ours ? null : h("span", { class: "tag other" }, "project " + r.project)),
        h("td", {}, r.stack),
        h("td", { class: "num" }, duration(r.durationS)),
        h("td", { class: "num" }, r.resumes || "0"),
        h("td", {}, homeCell(r)),
        h("td", { class: "num" }, money(r.costUsd)),
        h("td", { class: "last", title: r.lastLine }, r.lastLine)
      )
    );
    const body = $("runs").tBodies[0];
    body.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 8, class: "dim" }, "No runs yet: gpu-train train --script train.py"))]));
  }

  function drawSweeps() {
    $("sweeps-section").hidden = !doc.sweeps.length;
    $("sweeps").replaceChildren(
      ...doc.sweeps.map((s) =>
        h(
          "button",
          { class: "sweep" + (selected && selected.sweep === s.sweep ? " selected" : ""), onclick: () => select({ stack: s.stack, sweep: s.sweep }) },
          h("strong", {}, s.sweep), h("span", {}, s.runs.length + " trials on " + s.stack),
          h("span", {}, s.priced ? money(s.costUsd) : "cost unknown")
        )
      )
    );
  }

  function drawActions() {
    const list = doc.actions || [];
    $("actions-section").hidden = !list.length;
    $("actions").replaceChildren(
      ...list.slice().reverse().map((a) =>
        h("div", { class: "action" }, pill(a.state), h("code", {}, a.command), h("pre", {}, a.lines.slice(-6).join("\n")))
      )
    );
  }

  // -- one run or one sweep --------------------------------------------------------------------
  function select(what) {
    selected = what;
    drawRuns();
    drawSweeps();
    drawDetail(true);
    $("detail").scrollIntoView({ behavior: "smooth", block: "start" });
  }

  function drawDetail(fresh) {
    const box = $("detail");
    if (!selected) { box.hidden = true; return; }
    box.hidden = false;
    if (selected.sweep) {
      const sw = doc.sweeps.find((s) => s.sweep === selected.sweep && s.stack === selected.stack);
      $("detail-title").textContent = "Sweep " + selected.sweep;
      $("detail-meta").textContent = sw ? sw.runs.length + " trials on " + sw.stack + " · " + (sw.priced ? money(sw.costUsd) + " so far" : "cost unknown") : "";
      $("detail-buttons").replaceChildren();
      $("log").hidden = true;
      $("log-state").textContent = "a trial's log: click it in the table above";
      if (fresh) logLoop++; // (a run's log shown before stops following)
      if (fresh) loadCurves({ stack: selected.stack, sweep: selected.sweep, runs: sw ? sw.runs : [] });
      return;
    }
    $("log").hidden = false;
    const r = doc.runs.find((x) => x.id === selected.run && x.stack === selected.stack);
    $("detail-title").replaceChildren("Run " + selected.run + " ", r ? pill(r.state) : "");
    $("detail-meta").replaceChildren(
      ...(r ? [
        ["stack", r.stack], ["started", when(r.started || r.created)], ["ended", r.ended && !ACTIVE.includes(r.state) ? when(r.ended) : "–"],
        ["duration", duration(r.durationS)], ["resumes", r.resumes], ["preemptions", r.preemptions], ["exit code", r.exitCode === null ? "–" : r.exitCode],
        ["cost", money(r.costUsd)], ["outputs", r.home ? "fetched" : r.onlyHost ? "only on the host" : "–"],
      ].map(([k, v]) => h("span", { class: "kv" }, h("b", {}, k), " " + v)) : [])
    );
    const buttons = [];
    if (r && !REPORT) {
      if (ACTIVE.includes(r.state)) buttons.push(h("button", { class: "danger", onclick: () => act("stop", r.stack, r.id) }, "Stop run"));
      buttons.push(h("button", { onclick: () => act("fetch", r.stack, r.id) }, "Fetch"));
    }
    $("detail-buttons").replaceChildren(...buttons);
    if (fresh) {
      loadCurves({ stack: selected.stack, runs: [selected.run] });
      followLog(selected.stack, selected.run);
    }
  }

  // While the run (or a trial of the sweep) shown is at work, its curves are asked again now and then: the
  // server asks the host only when the run's files changed, and the charts are redrawn only when they did.
  function curvesAgain() {
    if (REPORT || !selected || Date.now() - curvesAsked < 5000) return;
    const runs = selected.sweep ? doc.runs.filter((r) => r.sweep === selected.sweep && r.stack === selected.stack) : doc.runs.filter((r) => r.id === selected.run && r.stack === selected.stack);
    if (!runs.some((r) => ACTIVE.includes(r.state))) return;
    loadCurves({ stack: selected.stack, sweep: selected.sweep, runs: runs.map((r) => r.id) });
  }

  async function loadCurves(what) {
    curvesAsked = Date.now();
    let answer;
    if (REPORT) {
      answer = { runs: {}, best: null };
      for (const id of what.runs) answer.runs[id] = (REPORT.curves || {})[what.stack + "/" + id] || [];
      answer.best = what.sweep ? ((REPORT.best || {})[what.stack + "/" + what.sweep] || null) : null;
    } else {
      const q = "stack=" + encodeURIComponent(what.stack) + (what.sweep ? "&sweep=" + encodeURIComponent(what.sweep) : "&run=" + encodeURIComponent(what.runs[0]));
      try { answer = await getJSON("api/curves?" + q); } catch (e) { answer = { runs: {}, error: e.message }; }
    }
    drawCurves(what, answer);
  }

  function drawCurves(what, answer) {
    const shown = JSON.stringify([what.stack, what.sweep, what.runs, answer]);
    if (shown === curvesShown) return;
    curvesShown = shown;
    while (charts.length) charts.pop().destroy();
    const box = $("curves");
    box.replaceChildren();
    const byTag = new Map();
    for (const run of Object.keys(answer.runs || {}).sort()) {
      for (const s of answer.runs[run]) {
        const tag = s.tag;
        if (!byTag.has(tag)) byTag.set(tag, []);
        byTag.get(tag).push({ run, s });
      }
    }
    if (!byTag.size) {
      box.append(h("p", { class: "dim" }, answer.error ? "curves could not be read: " + answer.error
        : "No scalars yet: TensorBoard event files, a *metrics*.jsonl or a *metrics*.csv file in JOB_DIR or the working directory make curves."));
      return;
    }
    const best = answer.best;
    if (best) box.append(h("p", { class: "best" }, "★ best trial: " + best.run + " (" + best.tag + " " + best.mode + " " + fmt(best.value) + ")"));
    if (what.sweep) box.append(trialTable(answer, best));
    const width = Math.max(300, Math.min(900, box.clientWidth / (byTag.size > 1 ? 2 : 1) - 36));
    for (const [tag, lines] of byTag) {
      const steps = [...new Set(lines.flatMap((l) => l.s.points.map((p) => p[0])))].sort((a, b) => a - b);
      const data = [steps];
      for (const l of lines) {
        const at = new Map(l.s.points.map((p) => [p[0], p[1]]));
        data.push(steps.map((x) => (at.has(x) ? at.get(x) : null)));
      }
      const series = [{ label: "step" }].concat(
        lines.map((l, i) => ({
          label: (best && best.run === l.run ? "★ " : "") + (what.sweep ? l.run : l.s.source),
          stroke: COLORS[i % COLORS.length],
          width: best && best.run === l.run ? 3 : 1.5,
          spanGaps: true,
          points: { show: l.s.points.length < 40 },
        }))
      );
      const holder = h("figure", { class: "chart", "data-tag": tag, "data-points": lines.map((l) => l.s.points.length).join(",") }, h("figcaption", {}, tag));
      box.append(holder);
      if (window.uPlot) {
        const css = getComputedStyle(document.documentElement);
        const axis = { stroke: css.getPropertyValue("--dim").trim(), grid: { stroke: css.getPropertyValue("--line").trim() }, ticks: { stroke: css.getPropertyValue("--line").trim() } };
        charts.push(new uPlot({ width, height: 220, series, scales: { x: { time: false } }, axes: [{ ...axis, label: "step" }, axis], legend: { live: false } }, data, holder));
      }
    }
  }
  // A sweep's trials side by side: state, the metric it is judged by (its best point), duration, cost.
  function trialTable(answer, best) {
    const tag = best ? best.tag : null, mode = best ? best.mode : null;
    const rows = Object.keys(answer.runs).sort().map((id) => {
      const r = doc.runs.find((x) => x.id === id && x.stack === selected.stack) || { id, state: "?" };
      const s = tag ? answer.runs[id].find((x) => x.tag === tag) : null;
      const point = s ? s[mode] : null;
      return h("tr", { class: "run" + (best && best.run === id ? " best-row" : ""), "data-run": id, onclick: () => select({ stack: selected.stack, run: id }) },
        h("td", { class: "run-id" }, (best && best.run === id ? "★ " : "") + id), h("td", {}, pill(r.state)),
        h("td", { class: "num" }, point ? fmt(point[1]) + " @ " + point[0] : "–"),
        h("td", { class: "num" }, duration(r.durationS)), h("td", { class: "num" }, money(r.costUsd)));
    });
    return h("table", { class: "runs trials" },
      h("thead", {}, h("tr", {}, h("th", {}, "Trial"), h("th", {}, "State"), h("th", { class: "num" }, tag ? tag + " " + mode + " @ step" : "metric"),
        h("th", { class: "num" }, "Duration"), h("th", { class: "num" }, "Cost"))),
      h("tbody", {}, rows));
  }
  const fmt = (v) => (v === null || v === undefined ? "–" : Math.abs(v) >= 1000 || Math.abs(v) < 0.001 ? v.toExponential(3) : v.toPrecision(4));

  async function followLog(stack, run) {
    const pre = $("log");
    logKey = stack + "/" + run;
    const mine = ++logLoop;
    pre.textContent = "";
    logAt = 0;
    if (REPORT) {
      pre.textContent = (REPORT.logs || {})[logKey] || "(no log in this report)";
      $("log-state").textContent = "its last lines when the report was written";
      return;
    }
    $("log-state").textContent = "following";
    while (mine === logLoop) {
      let part;
      try {
        part = await getJSON("api/log?stack=" + encodeURIComponent(stack) + "&run=" + encodeURIComponent(run) + "&from=" + logAt + "&wait=15");
      } catch (e) {
        $("log-state").textContent = "the dashboard did not answer; trying again";
        await new Promise((ok) => setTimeout(ok, 3000));
        continue;
      }
      if (mine !== logLoop) return;
      if (part.text) {
        const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 40;
        pre.append(part.text);
        if (atEnd) pre.scrollTop = pre.scrollHeight;
      }
      logAt = part.next;
      if (part.error) { $("log-state").textContent = "could not follow: " + part.error; await new Promise((ok) => setTimeout(ok, 10000)); }
      else if (part.ended) { $("log-state").textContent = "ended: " + (part.ended.state || "") + (part.ended.exitCode !== null && part.ended.exitCode !== undefined ? ", exit code " + part.ended.exitCode : ""); return; }
      else $("log-state").textContent = "following live";
    }
  }

  // -- start -----------------------------------------------------------------------------------
  if (REPORT) {
    doc = REPORT;
    draw();
  } else {
    refresh();
    setInterval(refresh, 2000);
    setInterval(() => { if (doc) $("freshness").textContent = "live · every " + doc.intervalS + " s · " + ago(doc.at); }, 1000);
  }
})();
