/* flowgraph monitor dashboard.
 *
 * Live mode: reads server-sent events from "events" (meta, epoch, complete).
 * Report mode: a JSON script element with id "flowgraph-report" holds everything; no network.
 * Charts are drawn here on <canvas>; no third-party code.
 */
(function () {
  "use strict";

  var PALETTE = ["#3b5bdb", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8", "#1098ad", "#f08c00", "#5c940d",
                 "#d6336c", "#364fc7", "#0b7285", "#862e9c"];
  var MAX_TABLE_ROWS = 1000;
  var SPLIT_WORDS = "train|training|val|valid|validation|test|eval|dev";
  var PREFIX_SPLIT = new RegExp("^(" + SPLIT_WORDS + ")[/_\\-](.+)$", "i");
  var SUFFIX_SPLIT = new RegExp("^(.+)[/_\\-](" + SPLIT_WORDS + ")$", "i");
  var RESOURCE_LABELS = {
    cpu: "CPU", gpu: "GPU", ram_used: "RAM used", vram_used: "VRAM used",
    pool_allocated: "pool allocated", pool_peak: "pool peak"
  };

  var state = {
    meta: {}, metaAt: 0, epochs: [], lastId: -1, complete: null,
    metricNames: [], resourceNames: [], graphKey: null, offline: false, connection: "connecting"
  };
  var charts = {};          // chart id -> LineChart
  var colorOf = {};         // series name -> colour, stable for the whole page
  var hiddenSeries = {};    // series name -> true when toggled off
  var dirty = false;

  // ---------------------------------------------------------------- formatting

  function fmtDuration(s) {
    if (s === null || s === undefined || !isFinite(s) || s < 0) return "–";
    if (s < 10) return s.toFixed(2) + "s";
    if (s < 59.95) return s.toFixed(1) + "s";
    var t = Math.round(s), m = Math.floor(t / 60), sec = t % 60;
    if (m < 60) return m + "m" + String(sec).padStart(2, "0") + "s";
    var h = Math.floor(m / 60); m = m % 60;
    if (h < 24) return h + "h" + String(m).padStart(2, "0") + "m";
    return Math.floor(h / 24) + "d" + String(h % 24).padStart(2, "0") + "h";
  }
  function fmtEta(s) {
    if (s === null || s === undefined || !isFinite(s) || s < 0) return "–";
    return s < 60 ? Math.round(s) + "s" : fmtDuration(s);
  }
  function fmtMetric(v) {
    if (v === null || v === undefined) return "–";
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential(3);
    return v.toFixed(4);
  }
  function fmtBytes(b) {
    if (b === null || b === undefined) return "–";
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0, v = b;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return i === 0 ? v.toFixed(0) + units[i] : v.toFixed(v >= 100 ? 0 : 1) + units[i];
  }
  function fmtAxis(v) {
    if (v === 0) return "0";
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) return v.toExponential(1);
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    return v.toPrecision(2);
  }
  function fmtCount(n) {
    if (n === null || n === undefined) return "–";
    var s = Number(n).toLocaleString("en-US");
    if (n >= 1e9) return s + " (" + (n / 1e9).toFixed(2) + "B)";
    if (n >= 1e6) return s + " (" + (n / 1e6).toFixed(2) + "M)";
    if (n >= 1e4) return s + " (" + (n / 1e3).toFixed(1) + "K)";
    return s;
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (k === "text") node.textContent = attrs[k];
        else if (k === "className") node.className = attrs[k];
        else node.setAttribute(k, attrs[k]);
      });
    }
    (children || []).forEach(function (c) { if (c) node.appendChild(c); });
    return node;
  }
  function $(id) { return document.getElementById(id); }
  function cssVar(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }
  function colorFor(name) {
    if (!colorOf[name]) colorOf[name] = PALETTE[Object.keys(colorOf).length % PALETTE.length];
    return colorOf[name];
  }

  // ---------------------------------------------------------------- metric groups

  /* One chart per group: the prefix before the last dot ("encoder.scan.loss" -> "encoder.scan"),
   * else the name without a train/val/test part ("val_loss", "loss/train" -> "loss"), else the name. */
  function groupOf(name) {
    var dot = name.lastIndexOf(".");
    if (dot > 0) return name.slice(0, dot);
    var m = name.match(PREFIX_SPLIT);
    if (m) return m[2];
    m = name.match(SUFFIX_SPLIT);
    if (m) return m[1];
    return name;
  }

  // ---------------------------------------------------------------- line chart (canvas)

  function niceStep(range, count) {
    var raw = range / Math.max(1, count), mag = Math.pow(10, Math.floor(Math.log10(raw))), n = raw / mag;
    return (n >= 5 ? 10 : n >= 2 ? 5 : n >= 1 ? 2 : 1) * mag;
  }
  function linearTicks(lo, hi, count) {
    if (hi <= lo) return { values: [lo], step: 1 };
    var step = niceStep(hi - lo, count), ticks = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return { values: ticks, step: step };
  }
  /* Ticks at round numbers of one binary unit (256MiB, 512MiB, ...), for byte axes. */
  function byteTicks(lo, hi, count) {
    var unit = 1;
    while (hi / unit >= 1024 && unit < Math.pow(1024, 4)) unit *= 1024;
    var t = linearTicks(lo / unit, hi / unit, count);
    return { values: t.values.map(function (v) { return v * unit; }), step: t.step * unit };
  }
  /* A tick label with as many decimals as the tick step needs: 0.0010, 0.0008, ... not 0.0010, 8.0e-4. */
  function fmtTick(v, step) {
    if (v === 0) return "0";
    var a = Math.max(Math.abs(v), step);
    if (a >= 1e5 || step < 1e-4) return v.toExponential(Math.max(0, Math.min(3, Math.ceil(Math.log10(a / step)) - 1)));
    return v.toFixed(Math.max(0, Math.ceil(-Math.log10(step) - 1e-9)));
  }

  function LineChart(container, options) {
    this.options = options;
    this.series = [];
    this.logScale = false;
    this.hover = null;
    var self = this;
    this.title = el("h3", { text: options.title, title: options.title });
    var head = el("div", { className: "chart-head" }, [this.title]);
    if (options.allowLog) {
      this.logButton = el("button", { className: "toggle", type: "button", "aria-pressed": "false", text: "log",
                                      title: "logarithmic y axis" });
      this.logButton.addEventListener("click", function () {
        self.logScale = !self.logScale;
        self.logButton.setAttribute("aria-pressed", String(self.logScale));
        self.draw();
      });
      head.appendChild(this.logButton);
    }
    this.legend = el("div", { className: "legend" });
    this.canvas = el("canvas", { className: "chart-canvas", role: "img", "aria-label": options.title });
    this.card = el("section", { className: "card chart", "data-chart": options.id }, [head, this.legend, this.canvas]);
    container.appendChild(this.card);
    this.canvas.addEventListener("mousemove", function (e) { self.onHover(e); });
    this.canvas.addEventListener("mouseleave", function () { self.hover = null; hideTooltip(); self.draw(); });
    if (window.ResizeObserver) new ResizeObserver(function () { self.draw(); }).observe(this.canvas);
  }

  LineChart.prototype.setSeries = function (series) {
    var names = series.map(function (s) { return s.name; }).join("\u0000");
    if (names !== this.legendKey) { this.legendKey = names; this.buildLegend(series); }
    this.series = series;
    this.draw();
  };

  LineChart.prototype.buildLegend = function (series) {
    var self = this;
    this.legend.textContent = "";
    series.forEach(function (s) {
      var button = el("button", { type: "button", "aria-pressed": String(!hiddenSeries[s.name]), title: "show or hide" },
                      [el("span", { className: "swatch" }), el("span", { text: s.label || s.name })]);
      button.firstChild.style.background = colorFor(s.name);
      button.addEventListener("click", function () {
        hiddenSeries[s.name] = !hiddenSeries[s.name];
        button.setAttribute("aria-pressed", String(!hiddenSeries[s.name]));
        self.draw();
      });
      self.legend.appendChild(button);
    });
  };

  LineChart.prototype.visible = function () {
    return this.series.filter(function (s) { return !hiddenSeries[s.name]; });
  };

  LineChart.prototype.layout = function () {
    var rect = this.canvas.getBoundingClientRect();
    return { w: rect.width, h: rect.height, left: 58, right: 12, top: 10, bottom: 26 };
  };

  LineChart.prototype.domain = function (visible) {
    var xs = [Infinity, -Infinity], ys = [Infinity, -Infinity], log = this.logScale;
    visible.forEach(function (s) {
      s.points.forEach(function (p) {
        if (p[1] === null || !isFinite(p[1]) || (log && p[1] <= 0)) return;
        xs[0] = Math.min(xs[0], p[0]); xs[1] = Math.max(xs[1], p[0]);
        ys[0] = Math.min(ys[0], p[1]); ys[1] = Math.max(ys[1], p[1]);
      });
    });
    if (!isFinite(xs[0])) return null;
    if (xs[0] === xs[1]) { xs[0] -= 1; xs[1] += 1; }
    if (this.options.yMin !== undefined && !log) ys[0] = Math.min(ys[0], this.options.yMin);
    if (this.options.yMax !== undefined && !log) ys[1] = Math.max(ys[1], this.options.yMax);
    if (log) {
      ys = [Math.log10(ys[0]), Math.log10(ys[1])];
      if (ys[0] === ys[1]) { ys[0] -= 0.5; ys[1] += 0.5; }
    } else if (ys[0] === ys[1]) {
      var pad = Math.abs(ys[0]) * 0.1 || 1; ys[0] -= pad; ys[1] += pad;
    } else if (this.options.yMin === undefined) {
      var span = ys[1] - ys[0]; ys[0] -= span * 0.05; ys[1] += span * 0.05;
    }
    return { x: xs, y: ys };
  };

  LineChart.prototype.draw = function () {
    var canvas = this.canvas, box = this.layout();
    if (box.w <= 0 || box.h <= 0) return;
    var ratio = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(box.w * ratio) || canvas.height !== Math.round(box.h * ratio)) {
      canvas.width = Math.round(box.w * ratio); canvas.height = Math.round(box.h * ratio);
    }
    var ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, box.w, box.h);
    var visible = this.visible(), dom = this.domain(visible), log = this.logScale, fmt = this.options.format;
    var plotW = box.w - box.left - box.right, plotH = box.h - box.top - box.bottom;
    ctx.font = "11px system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif";
    if (!dom) {
      ctx.fillStyle = cssVar("--muted"); ctx.textAlign = "center";
      ctx.fillText(this.series.length ? "all series hidden" : "no data", box.w / 2, box.h / 2);
      return;
    }
    var sx = function (x) { return box.left + (x - dom.x[0]) / (dom.x[1] - dom.x[0]) * plotW; };
    var ty = function (y) { return log ? Math.log10(y) : y; };
    var sy = function (y) { return box.top + plotH - (ty(y) - dom.y[0]) / (dom.y[1] - dom.y[0]) * plotH; };
    this.scale = { sx: sx, sy: sy, dom: dom, box: box };

    // grid and y labels
    ctx.strokeStyle = cssVar("--grid"); ctx.fillStyle = cssVar("--axis"); ctx.lineWidth = 1;
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    var yticks, label;
    if (log) {
      yticks = { values: [], step: 0 };
      for (var e = Math.ceil(dom.y[0]); e <= Math.floor(dom.y[1]); e++) yticks.values.push(Math.pow(10, e));
      if (yticks.values.length < 2) yticks = linearTicks(Math.pow(10, dom.y[0]), Math.pow(10, dom.y[1]), 4);
      label = fmt || (yticks.step ? function (v) { return fmtTick(v, yticks.step); } : fmtAxis);
    } else {
      yticks = (this.options.bytes ? byteTicks : linearTicks)(dom.y[0], dom.y[1], 5);
      label = fmt || function (v) { return fmtTick(v, yticks.step); };
    }
    yticks.values.forEach(function (v) {
      var y = Math.round(sy(v)) + 0.5;
      if (y < box.top - 1 || y > box.top + plotH + 1) return;
      ctx.beginPath(); ctx.moveTo(box.left, y); ctx.lineTo(box.left + plotW, y); ctx.stroke();
      ctx.fillText(label(v), box.left - 8, y);
    });
    // x labels (epochs are integers)
    ctx.textAlign = "center"; ctx.textBaseline = "top";
    var xstep = Math.max(1, niceStep(dom.x[1] - dom.x[0], Math.max(2, Math.floor(plotW / 80))));
    for (var xv = Math.ceil(dom.x[0] / xstep) * xstep; xv <= dom.x[1]; xv += xstep) {
      ctx.fillText(String(Math.round(xv)), sx(xv), box.top + plotH + 8);
    }
    ctx.strokeStyle = cssVar("--axis");
    ctx.beginPath(); ctx.moveTo(box.left, box.top + plotH + 0.5); ctx.lineTo(box.left + plotW, box.top + plotH + 0.5); ctx.stroke();

    // series
    ctx.save();
    ctx.beginPath(); ctx.rect(box.left, box.top - 2, plotW, plotH + 4); ctx.clip();
    visible.forEach(function (s) {
      var color = colorFor(s.name), started = false, drawn = 0;
      ctx.strokeStyle = color; ctx.lineWidth = 2; ctx.lineJoin = "round"; ctx.beginPath();
      s.points.forEach(function (p) {
        if (p[1] === null || !isFinite(p[1]) || (log && p[1] <= 0)) { started = false; return; }
        var x = sx(p[0]), y = sy(p[1]);
        if (started) ctx.lineTo(x, y); else ctx.moveTo(x, y);
        started = true; drawn++;
      });
      ctx.stroke();
      if (s.points.length <= 60 || drawn === 1) {
        ctx.fillStyle = color;
        s.points.forEach(function (p) {
          if (p[1] === null || !isFinite(p[1]) || (log && p[1] <= 0)) return;
          ctx.beginPath(); ctx.arc(sx(p[0]), sy(p[1]), 2.5, 0, Math.PI * 2); ctx.fill();
        });
      }
    });
    ctx.restore();

    // hover crosshair
    if (this.hover !== null) {
      var hx = Math.round(sx(this.hover)) + 0.5;
      ctx.strokeStyle = cssVar("--axis"); ctx.setLineDash([3, 3]);
      ctx.beginPath(); ctx.moveTo(hx, box.top); ctx.lineTo(hx, box.top + plotH); ctx.stroke();
      ctx.setLineDash([]);
    }
  };

  LineChart.prototype.onHover = function (event) {
    if (!this.scale) return;
    var rect = this.canvas.getBoundingClientRect(), px = event.clientX - rect.left, sc = this.scale;
    var x = sc.dom.x[0] + (px - sc.box.left) / (sc.box.w - sc.box.left - sc.box.right) * (sc.dom.x[1] - sc.dom.x[0]);
    var best = null;
    this.visible().forEach(function (s) {
      s.points.forEach(function (p) { if (best === null || Math.abs(p[0] - x) < Math.abs(best - x)) best = p[0]; });
    });
    if (best === null) return;
    this.hover = best;
    this.draw();
    var rows = [], fmt = this.options.valueFormat || fmtMetric;
    this.visible().forEach(function (s) {
      s.points.forEach(function (p) {
        if (p[0] === best) rows.push({ name: s.label || s.name, color: colorFor(s.name), value: fmt(p[1]) });
      });
    });
    showTooltip(event.clientX, event.clientY, "epoch " + best, rows);
  };

  function showTooltip(x, y, title, rows) {
    var tip = $("tooltip");
    tip.textContent = "";
    tip.appendChild(el("div", { className: "tt-title", text: title }));
    rows.forEach(function (r) {
      var dot = el("span", { className: "swatch" });
      dot.style.background = r.color;
      tip.appendChild(el("div", { className: "tt-row" }, [el("span", {}, [dot, document.createTextNode(r.name)]),
                                                           el("span", { text: r.value })]));
    });
    tip.hidden = false;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    tip.style.left = Math.min(x + 14, window.innerWidth - w - 8) + "px";
    tip.style.top = Math.max(8, Math.min(y - h / 2, window.innerHeight - h - 8)) + "px";
  }
  function hideTooltip() { $("tooltip").hidden = true; }

  // ---------------------------------------------------------------- data intake

  function addEpoch(epoch) {
    state.epochs.push(epoch);
    Object.keys(epoch.metrics || {}).forEach(function (n) {
      if (state.metricNames.indexOf(n) < 0) state.metricNames.push(n);
    });
    Object.keys(epoch.resources || {}).forEach(function (n) {
      if (state.resourceNames.indexOf(n) < 0) state.resourceNames.push(n);
    });
    schedule();
  }
  function setMeta(meta) { state.meta = meta; state.metaAt = Date.now(); schedule(); }
  function setComplete(final) { state.complete = final; schedule(); }
  function setConnection(status) { state.connection = status; schedule(); }

  function schedule() {
    if (dirty) return;
    dirty = true;
    window.requestAnimationFrame(function () { dirty = false; render(); });
  }

  // ---------------------------------------------------------------- rendering

  function status() {
    if (state.complete) return state.complete.status;
    if (state.meta.status && state.meta.status !== "running") return state.meta.status;
    if (state.offline) return state.meta.status || "running";
    if (state.connection !== "open") return state.connection;
    return "running";
  }

  function elapsed() {
    if (state.complete) return state.complete.elapsed;
    var m = state.meta;
    if (m.started_at === undefined) return null;
    if (state.offline || (m.status && m.status !== "running")) return m.elapsed;
    return (m.now - m.started_at) + (Date.now() - state.metaAt) / 1000;
  }

  function renderHeader() {
    var m = state.meta, last = state.epochs[state.epochs.length - 1], total = m.total || (last && last.total) || 0;
    var done = last ? last.epoch : 0, st = status();
    var title = m.title || "training";
    $("title").textContent = title;
    document.title = (state.offline ? "report · " : "") + title + " · flowgraph";
    var badge = $("status");
    badge.textContent = st; badge.setAttribute("data-status", st);
    $("epoch-done").textContent = String(done);
    $("epoch-total").textContent = total ? String(total) : "–";
    var pct = total ? Math.min(100, done / total * 100) : 0;
    $("percent").textContent = pct.toFixed(pct > 0 && pct < 10 ? 1 : 0) + "%";
    var fill = $("progress-fill");
    fill.style.width = pct + "%"; fill.setAttribute("data-status", st);
    $("progress").setAttribute("aria-valuenow", pct.toFixed(0));
    $("eta").textContent = st === "running" && last && last.epoch < total ? fmtEta(last.eta) : "–";
    $("last-seconds").textContent = last ? fmtDuration(last.seconds) : "–";
    var sum = 0;
    state.epochs.forEach(function (e) { sum += e.seconds; });
    $("mean-seconds").textContent = state.epochs.length ? fmtDuration(sum / state.epochs.length) : "–";
    renderElapsed();
    $("footer-note").textContent = state.offline
      ? "training report · saved " + new Date((m.now || 0) * 1000).toLocaleString()
      : "live via server-sent events";
  }
  function renderElapsed() { $("elapsed").textContent = fmtDuration(elapsed()); }

  function renderModel() {
    var model = state.meta.model || {}, rows = [];
    function row(k, v, cls) { rows.push(el("div", {}, [el("dt", { text: k }), el("dd", { text: v, className: cls || "" })])); }
    if (model.label) row("Label", model.label);
    if (model.parameters) {
      row("Parameters", fmtCount(model.parameters.total));
      row("Trainable", fmtCount(model.parameters.trainable));
      row("Frozen", fmtCount(model.parameters.frozen));
    }
    if (model.structural_hash) row("Structural hash", model.structural_hash, "hash");
    if (model.device) row("Device", model.device);
    var box = $("model");
    box.textContent = "";
    if (!rows.length) rows.push(el("div", {}, [el("dt", { text: "Graph" }), el("dd", { text: "no graph attached", className: "muted" })]));
    rows.forEach(function (r) { box.appendChild(r); });
  }

  function renderLatest() {
    var n = state.epochs.length;
    if (!n) return;
    var last = state.epochs[n - 1].metrics, prev = n > 1 ? state.epochs[n - 2].metrics : {};
    var box = $("latest");
    box.textContent = "";
    Object.keys(last).forEach(function (name) {
      var v = last[name], p = prev[name], tile = el("div", { className: "metric-tile", title: name }, [
        el("div", { className: "name", text: name }), el("div", { className: "num", text: fmtMetric(v) })]);
      if (v !== null && p !== null && p !== undefined && v !== p) {
        var d = v - p;
        tile.lastChild.appendChild(el("span", { className: "delta", title: "change since the previous epoch",
                                                text: (d < 0 ? "▼ " : "▲ ") + fmtMetric(Math.abs(d)) }));
      }
      box.appendChild(tile);
    });
  }

  function ensureChart(containerId, id, options) {
    if (!charts[id]) {
      var container = $(containerId);
      var empty = container.querySelector(".empty");
      if (empty) empty.remove();
      options.id = id;
      charts[id] = new LineChart(container, options);
    }
    return charts[id];
  }

  function pointsOf(pick) {
    return state.epochs.map(function (e) { var v = pick(e); return [e.epoch, v === undefined ? null : v]; });
  }

  function renderCharts() {
    var groups = {}, order = [];
    state.metricNames.forEach(function (name) {
      var g = groupOf(name);
      if (!groups[g]) { groups[g] = []; order.push(g); }
      groups[g].push(name);
    });
    order.forEach(function (g) {
      var chart = ensureChart("metric-charts", "metric:" + g, { title: g, allowLog: true });
      chart.setSeries(groups[g].map(function (name) {
        return { name: name, points: pointsOf(function (e) { return e.metrics[name]; }) };
      }));
    });
    var res = state.resourceNames;
    var util = ["cpu", "gpu"].filter(function (k) { return res.indexOf(k) >= 0; });
    if (util.length) {
      ensureChart("resource-charts", "res:util", { title: "Utilisation (%)", yMin: 0, yMax: 100,
        valueFormat: function (v) { return v === null ? "–" : v.toFixed(1) + "%"; } })
        .setSeries(util.map(function (k) {
          return { name: "res:" + k, label: RESOURCE_LABELS[k], points: pointsOf(function (e) { return e.resources[k]; }) };
        }));
    }
    var mem = ["ram_used", "vram_used", "pool_allocated", "pool_peak"].filter(function (k) { return res.indexOf(k) >= 0; });
    if (mem.length) {
      var last = state.epochs[state.epochs.length - 1].resources, totals = [];
      if (last.ram_total) totals.push("RAM " + fmtBytes(last.ram_total));
      if (last.vram_total) totals.push("VRAM " + fmtBytes(last.vram_total));
      var chart = ensureChart("resource-charts", "res:mem", { title: "Memory", yMin: 0, bytes: true, format: fmtBytes, valueFormat: fmtBytes });
      chart.title.textContent = "Memory" + (totals.length ? " (of " + totals.join(", ") + ")" : "");
      chart.setSeries(mem.map(function (k) {
        return { name: "res:" + k, label: RESOURCE_LABELS[k], points: pointsOf(function (e) { return e.resources[k]; }) };
      }));
    }
    if (state.epochs.length) {
      ensureChart("resource-charts", "res:time", { title: "Epoch time (s)", yMin: 0, allowLog: false,
        valueFormat: fmtDuration })
        .setSeries([{ name: "res:seconds", label: "seconds per epoch", points: pointsOf(function (e) { return e.seconds; }) }]);
    }
  }

  var tableKey = null, tableRows = 0;
  function renderTable() {
    var table = $("epochs"), names = state.metricNames, res = state.resourceNames;
    var showCpu = res.indexOf("cpu") >= 0, showRam = res.indexOf("ram_used") >= 0, showGpu = res.indexOf("gpu") >= 0;
    var key = names.join("\u0000") + "|" + showCpu + showRam + showGpu;
    var tbody = table.tBodies[0];
    if (key !== tableKey) {
      tableKey = key; tableRows = 0;
      var head = ["epoch", "time", "ETA"].concat(names);
      if (showCpu) head.push("CPU");
      if (showGpu) head.push("GPU");
      if (showRam) head.push("RAM");
      table.tHead.textContent = "";
      table.tHead.appendChild(el("tr", {}, head.map(function (h) { return el("th", { text: h, title: h }); })));
      tbody.textContent = "";
    }
    function cell(text, isNull) { return el("td", { text: text, className: isNull ? "null" : "" }); }
    for (var i = tableRows; i < state.epochs.length; i++) {
      var e = state.epochs[i], cells = [cell(e.epoch + " / " + e.total), cell(fmtDuration(e.seconds)), cell(fmtEta(e.eta))];
      names.forEach(function (n) { var v = e.metrics[n]; cells.push(cell(fmtMetric(v), v === null || v === undefined)); });
      if (showCpu) cells.push(cell(e.resources.cpu === undefined ? "–" : e.resources.cpu.toFixed(0) + "%"));
      if (showGpu) cells.push(cell(e.resources.gpu === undefined ? "–" : e.resources.gpu.toFixed(0) + "%"));
      if (showRam) cells.push(cell(fmtBytes(e.resources.ram_used)));
      tbody.insertBefore(el("tr", { "data-epoch": String(e.epoch) }, cells), tbody.firstChild);
    }
    tableRows = state.epochs.length;
    while (tbody.rows.length > MAX_TABLE_ROWS) tbody.deleteRow(tbody.rows.length - 1);
    $("table-note").textContent = state.epochs.length > MAX_TABLE_ROWS
      ? "· newest " + MAX_TABLE_ROWS + " of " + state.epochs.length + " (the CSV export has all)"
      : state.epochs.length ? "· newest first" : "";
  }

  // ---------------------------------------------------------------- graph picture
  // The server's Graphviz SVG (/graph.svg) when it has one, else the DOT (/graph.dot) rendered here by the
  // vendored viz.js (Graphviz in WebAssembly, static/viz-global.js, loaded on first need). Either way the SVG
  // is inlined so its nodes (ids "fg:<path>") can be clicked: the panel shows the node's details from
  // meta.graph.nodes (path, modules, parameters, frozen state, time of the last profiled forward).

  var reportSvg = null, vizReady = null;
  function loadViz() {
    if (!vizReady) {
      vizReady = new Promise(function (resolve, reject) {
        if (window.Viz) { resolve(window.Viz); return; }
        var script = document.createElement("script");
        script.src = "static/viz-global.js";
        script.onload = function () {
          if (window.Viz) resolve(window.Viz); else reject(new Error("static/viz-global.js defined no Viz"));
        };
        script.onerror = function () { reject(new Error("could not load static/viz-global.js")); };
        document.head.appendChild(script);
      }).then(function (Viz) { return Viz.instance(); });
      vizReady.catch(function () { vizReady = null; });  // a later attempt may load it
    }
    return vizReady;
  }
  function fetchText(url) {
    return fetch(url, { cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error(url.split("?")[0] + " answered HTTP " + r.status);
      return r.text();
    });
  }
  function parseSvg(text) {
    var root = new DOMParser().parseFromString(text, "image/svg+xml").documentElement;
    if (!root || root.nodeName.toLowerCase() !== "svg") throw new Error("the graph picture is not an SVG");
    return document.importNode(root, true);
  }
  function fmtCount(n) { return n === undefined || n === null ? "–" : Number(n).toLocaleString("en-US"); }

  function showNode(box, node, info) {
    Array.prototype.forEach.call(box.querySelectorAll(".fg-selected"), function (n) {
      n.classList.remove("fg-selected");
    });
    node.classList.add("fg-selected");
    var rows = [["path", "Path", info.path], ["kind", "Verb", info.kind],
                ["modules", "Modules", (info.modules || []).join(", ") || "–"],
                ["parameters", "Parameters", fmtCount(info.parameters)],
                ["trainable", "Trainable", fmtCount(info.trainable)], ["frozen", "State", info.frozen]];
    if (info.seconds !== undefined) {
      rows.push(["time", "Time", (info.seconds * 1e3).toFixed(3) + " ms (" + Math.round(100 * (info.share || 0)) +
                 "% of the forward)"]);
    }
    var panel = $("graph-panel");
    panel.textContent = "";
    panel.setAttribute("data-path", info.path);
    panel.appendChild(el("dl", { className: "kv" }, rows.map(function (r) {
      return el("div", { "data-field": r[0] }, [el("dt", { text: r[1] }), el("dd", { text: String(r[2]) })]);
    })));
  }

  function showSvg(box, svg, g, renderer) {
    box.textContent = "";
    box.setAttribute("data-renderer", renderer);
    svg.removeAttribute("width");   // scale to the card; the viewBox keeps the proportions
    svg.removeAttribute("height");
    svg.setAttribute("class", "graph-svg");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "graph structure");
    var details = {}, heat = false;
    (g.nodes || []).forEach(function (n) { details["fg:" + n.id] = n; if (n.seconds !== undefined) heat = true; });
    box.appendChild(svg);
    var note = renderer === "browser" ? "drawn in the browser (no Graphviz on the server)" : "drawn by Graphviz";
    if (heat) note += "; colour: share of the last profiled forward's time (white to red)";
    var noteEl = el("p", { className: "muted small graph-note", text: note + ". Click a node for its details. " });
    if (renderer === "server" && !state.offline) {
      noteEl.appendChild(el("a", { href: "graph.svg", target: "_blank", rel: "noopener", text: "Open the SVG" }));
    }
    box.appendChild(noteEl);
    box.appendChild(el("div", { id: "graph-panel", className: "graph-panel" }));
    Array.prototype.forEach.call(svg.querySelectorAll("g.node"), function (node) {
      var info = details[node.id];
      if (!info) return;
      node.classList.add("fg-node");
      node.setAttribute("tabindex", "0");
      node.addEventListener("click", function (e) { e.preventDefault(); showNode(box, node, info); });
      node.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); showNode(box, node, info); }
      });
    });
  }

  function showDotSource(box, g, error) {
    box.textContent = "";
    box.setAttribute("data-renderer", "source");
    var why = error ? String(error.message || error) : g.error;
    box.appendChild(el("p", { className: "muted",
      text: "The graph picture could not be drawn" + (why ? " (" + why + ")" : "") + ". The DOT source:" }));
    box.appendChild(el("pre", { text: g.dot || "" }));
  }

  function renderGraph() {
    var g = state.meta.graph || { kind: "none" }, key = JSON.stringify(g);
    if (key === state.graphKey) return;
    state.graphKey = key;
    var box = $("graph");
    function current() { return key === state.graphKey; }
    if (g.kind === "svg") {
      var text = state.offline ? Promise.resolve(reportSvg) : fetchText("graph.svg?v=" + Date.now());
      text.then(function (t) {
        if (!t) throw new Error("the report holds no SVG");
        if (current()) showSvg(box, parseSvg(t), g, "server");
      }).catch(function (err) { if (current()) showDotSource(box, g, err); });
    } else if (g.kind === "dot") {
      // The report inlines viz.js when it has no SVG; the DOT is in its metadata, nothing is fetched.
      if (state.offline && !window.Viz) { showDotSource(box, g, null); return; }
      box.textContent = "";
      box.appendChild(el("p", { className: "muted", text: "Drawing the graph in the browser…" }));
      var source = state.offline ? Promise.resolve(g.dot) : fetchText("graph.dot?v=" + Date.now());
      Promise.all([loadViz(), source]).then(function (r) {
        if (current()) showSvg(box, r[0].renderSVGElement(r[1]), g, "browser");
      }).catch(function (err) { if (current()) showDotSource(box, g, err); });
    }
  }

  function render() {
    renderHeader();
    renderModel();
    renderLatest();
    renderCharts();
    renderTable();
    renderGraph();
  }

  // ---------------------------------------------------------------- sources

  function connect() {
    var source = new EventSource("events");
    source.addEventListener("open", function () { setConnection("open"); });
    source.addEventListener("meta", function (e) { setMeta(JSON.parse(e.data)); });
    source.addEventListener("epoch", function (e) {
      var id = Number(e.lastEventId);
      if (e.lastEventId !== "" && id <= state.lastId) return;  // already have it (a resumed stream)
      if (e.lastEventId !== "") state.lastId = id;
      addEpoch(JSON.parse(e.data));
    });
    source.addEventListener("complete", function (e) {
      setComplete(JSON.parse(e.data));
      source.close();
    });
    source.addEventListener("error", function () {
      if (state.complete) return;
      setConnection(source.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting");
    });
  }

  function start() {
    var embedded = $("flowgraph-report");
    if (embedded) {
      var data = JSON.parse(embedded.textContent);
      state.offline = true;
      reportSvg = data.graph_svg || null;
      setMeta(data.meta || {});
      (data.epochs || []).forEach(addEpoch);
      if (data.complete) setComplete(data.complete);
      render();
      return;
    }
    connect();
    window.setInterval(function () { if (status() === "running") renderElapsed(); }, 1000);
  }

  // For tests and the curious: window.flowgraphMonitor.groupOf("val_loss") === "loss".
  window.flowgraphMonitor = { groupOf: groupOf, state: state };
  start();
})();
