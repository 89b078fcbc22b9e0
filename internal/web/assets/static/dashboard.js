// The dashboard's only script: it swaps in the server-rendered live part
// every few seconds, draws the timeline from /api/history as small SVG
// charts, and posts the actions with the token.
(function () {
  "use strict";
  var refresh = parseInt(document.body.dataset.refresh, 10) || 2000;
  var live = document.getElementById("live");
  var counter = document.getElementById("refreshes");
  var msg = document.getElementById("msg");
  var tokenInput = document.getElementById("token");
  var charts = document.getElementById("charts");
  if (tokenInput) {
    tokenInput.value = sessionStorage.getItem("compartment-token") || "";
    tokenInput.addEventListener("change", function () {
      sessionStorage.setItem("compartment-token", tokenInput.value);
    });
  }

  // A button held down (pressed, not yet released) must stay in place: a
  // swap of the live part between the press and the release would put a
  // new button under the pointer, and the click would be lost. The swap
  // waits for the next refresh.
  var pressed = false;
  document.addEventListener("pointerdown", function () { pressed = true; }, true);
  function released() { setTimeout(function () { pressed = false; }, 0); } // after the click it ends
  document.addEventListener("pointerup", released, true);
  document.addEventListener("pointercancel", released, true);
  window.addEventListener("blur", released); // released outside the window

  function update() {
    var parts = [fetch("/live", {cache: "no-store"})
      .then(function (r) { return r.text(); })
      .then(function (html) { if (!pressed) { live.innerHTML = html; } })];
    if (charts) {
      parts.push(fetch("/api/history", {cache: "no-store"})
        .then(function (r) { return r.json(); })
        .then(drawTimeline));
    }
    return Promise.all(parts)
      .then(function () {
        var n = parseInt(counter.dataset.n, 10) + 1;
        counter.dataset.n = n;
        counter.textContent = n;
      })
      .catch(function (e) { msg.textContent = "refresh failed: " + e; });
  }

  function tick() { update().finally(function () { setTimeout(tick, refresh); }); }
  if (charts) {
    update().finally(function () { setTimeout(tick, refresh); });
  } else {
    setTimeout(tick, refresh);
  }

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("button.act");
    if (!b) { return; }
    var form = new URLSearchParams();
    ["pool", "queue", "id", "op"].forEach(function (k) { if (b.dataset[k]) { form.set(k, b.dataset[k]); } });
    var headers = {"Content-Type": "application/x-www-form-urlencoded"};
    if (tokenInput && tokenInput.value) { headers["X-Compartment-Token"] = tokenInput.value; }
    fetch("/actions/" + b.dataset.action, {method: "POST", headers: headers, body: form.toString()})
      .then(function (r) {
        return r.text().then(function (t) {
          // An action answers a line of text, or JSON (cancel-run) whose
          // message or error says it.
          if ((r.headers.get("Content-Type") || "").indexOf("application/json") === 0) {
            try { var j = JSON.parse(t); t = j.message || j.error || t; } catch (e) { /* shown as it came */ }
          }
          msg.textContent = t;
          msg.className = r.ok ? "ok" : "refused";
        });
      })
      .then(update);
  });

  // ---- the timeline ----

  var SVG = "http://www.w3.org/2000/svg";
  var W = 320, H = 96, PAD_L = 34, PAD_B = 14, PAD_T = 6;
  var TIER_COLORS = ["#c0392b", "#d9822b", "#3a7bd5", "#6b7385", "#7a5af8", "#2e8b57"];

  function el(name, attrs, text) {
    var e = document.createElementNS(SVG, name);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function fmt(v) {
    if (v === null || v === undefined) { return "-"; }
    if (Math.abs(v) >= 100) { return String(Math.round(v)); }
    return String(Math.round(v * 10) / 10);
  }

  // chart draws series ([{name, color, dashed, points: [[t, v|null]]}])
  // over [t0, t1], with the phase changes as marks, into a titled box. The
  // svg carries data-chart=key and each line data-series and data-last
  // (its last value), so a test can read what is drawn.
  function chart(key, title, series, t0, t1, marks, unit) {
    var box = document.createElement("div");
    box.className = "chart";
    var h = document.createElement("div");
    h.className = "ctitle";
    h.textContent = title;
    box.appendChild(h);
    var ymax = 0;
    series.forEach(function (s) {
      s.points.forEach(function (p) { if (p[1] !== null && p[1] > ymax) { ymax = p[1]; } });
    });
    ymax = ymax > 0 ? ymax * 1.1 : 1;
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H, "data-chart": key, role: "img", "aria-label": title});
    var x = function (t) { return PAD_L + (W - PAD_L - 4) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1); };
    var y = function (v) { return H - PAD_B - (H - PAD_B - PAD_T) * (v / ymax); };
    svg.appendChild(el("line", {x1: PAD_L, y1: H - PAD_B, x2: W - 4, y2: H - PAD_B, class: "axis"}));
    svg.appendChild(el("text", {x: PAD_L - 3, y: PAD_T + 8, class: "tick", "text-anchor": "end"}, fmt(ymax) + (unit || "")));
    svg.appendChild(el("text", {x: PAD_L - 3, y: H - PAD_B, class: "tick", "text-anchor": "end"}, "0"));
    svg.appendChild(el("text", {x: PAD_L, y: H - 2, class: "tick"}, "-" + Math.round((t1 - t0) / 60000) + " min"));
    svg.appendChild(el("text", {x: W - 4, y: H - 2, class: "tick", "text-anchor": "end"}, "now"));
    marks.forEach(function (m) {
      var mx = x(m.t);
      svg.appendChild(el("line", {x1: mx, y1: PAD_T, x2: mx, y2: H - PAD_B, class: "phase"}));
      svg.appendChild(el("text", {x: mx + 2, y: PAD_T + 8, class: "phase-label"}, m.label));
    });
    var legend = document.createElement("div");
    legend.className = "legend";
    series.forEach(function (s) {
      var d = "", last = null, pen = false;
      s.points.forEach(function (p) {
        if (p[1] === null) { pen = false; return; }
        d += (pen ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1);
        pen = true;
        last = p[1];
      });
      var path = el("path", {d: d || "M0 0", fill: "none", stroke: s.color, "stroke-width": 1.6, "data-series": s.name, "data-last": last === null ? "" : String(last)});
      if (s.dashed) { path.setAttribute("stroke-dasharray", "4 3"); }
      svg.appendChild(path);
      var item = document.createElement("span");
      item.style.color = s.color;
      item.textContent = s.name + " " + fmt(last) + (unit || "");
      legend.appendChild(item);
    });
    box.appendChild(svg);
    box.appendChild(legend);
    return box;
  }

  function drawTimeline(h) {
    var samples = h.samples || [];
    if (samples.length === 0) { return; }
    var t1 = samples[samples.length - 1].at;
    var t0 = Math.min(samples[0].at, t1 - 60000);
    var marks = [];
    samples.forEach(function (s, i) {
      if (s.phase && (i === 0 || samples[i - 1].phase !== s.phase)) { marks.push({t: s.at, label: s.phase.split(":")[0]}); }
    });
    var frag = document.createDocumentFragment();

    // The scene's gauges (the demo's phases), first.
    if ((h.gauges || []).length > 0) {
      var row = document.createElement("div");
      row.className = "chartrow";
      var head = document.createElement("div");
      head.className = "rowhead";
      head.textContent = "story";
      row.appendChild(head);
      h.gauges.forEach(function (g) {
        var series = [{name: g.label, color: "#c0392b", points: samples.map(function (s) {
          return [s.at, s.gauges && g.key in s.gauges ? s.gauges[g.key] : null];
        })}];
        if (g.max > 0) {
          series.push({name: "limit", color: "#6b7385", dashed: true, points: samples.map(function (s) { return [s.at, g.max]; })});
        }
        row.appendChild(chart("scene/" + g.key, g.label, series, t0, t1, marks));
      });
      frag.appendChild(row);
    }

    var pools = samples[samples.length - 1].pools.map(function (p) { return p.pool; });
    pools.forEach(function (name) {
      var of = function (s) {
        for (var i = 0; i < s.pools.length; i++) { if (s.pools[i].pool === name) { return s.pools[i]; } }
        return null;
      };
      var row = document.createElement("div");
      row.className = "chartrow";
      row.dataset.pool = name;
      var head = document.createElement("div");
      head.className = "rowhead";
      head.textContent = name;
      row.appendChild(head);
      var pick = function (f) { return samples.map(function (s) { var p = of(s); return [s.at, p ? f(p) : null]; }); };
      row.appendChild(chart(name + "/slots", "slots in use / size", [
        {name: "running", color: "#3a7bd5", points: pick(function (p) { return p.running; })},
        {name: "size", color: "#6b7385", dashed: true, points: pick(function (p) { return p.size; })},
        {name: "waiting for slot", color: "#d9822b", points: pick(function (p) { return p.for_slot; })}
      ], t0, t1, marks));
      row.appendChild(chart(name + "/done", "jobs done per second", [
        {name: "done/s", color: "#2e8b57", points: pick(function (p) { return p.done_per_second < 0 ? null : p.done_per_second; })}
      ], t0, t1, marks));
      var tiers = [];
      samples.forEach(function (s) {
        var p = of(s);
        Object.keys((p && p.wait_p95) || {}).forEach(function (t) { if (tiers.indexOf(t) < 0) { tiers.push(t); } });
      });
      row.appendChild(chart(name + "/wait", "wait p95 by tier (this worker)", tiers.map(function (t, i) {
        return {name: t || name, color: TIER_COLORS[i % TIER_COLORS.length], points: pick(function (p) {
          return p.wait_p95 && t in p.wait_p95 ? p.wait_p95[t] : null;
        })};
      }), t0, t1, marks, "s"));
      frag.appendChild(row);
    });
    charts.replaceChildren(frag);
    charts.dataset.samples = samples.length;
    charts.dataset.last = t1;
  }
})();
