#include "server/chat_page.h"

namespace strata::server {

namespace {

// Polls GET /expert-cache once a second. From two readings it takes the interval's hit rate
// (hits over lookups; none while idle) and read rate (bytes over the server's clock), keeps the
// last 120 and draws them as two lines; the heat map has a row per layer and a column per
// expert, lit where the expert holds a cache slot, and its legend gives the resident count and
// the range of the layers' resident shares. The canvases carry what they show as data
// attributes (the Chromium test reads them).
constexpr std::string_view kPanelScript = R"script(
const cachePanel = (() => {
  const kept = 120;
  const history = [];  // per interval: { hit: 0..1 or null, gbps }
  let last = null;

  function bytes(n) {
    if (n >= 1e9) return (n / 1e9).toFixed(2) + " GB";
    if (n >= 1e6) return (n / 1e6).toFixed(1) + " MB";
    return (n / 1e3).toFixed(1) + " kB";
  }

  function drawChart() {
    const canvas = $("cache-chart");
    const g = canvas.getContext("2d");
    const w = canvas.width, h = canvas.height;
    g.clearRect(0, 0, w, h);
    g.strokeStyle = "#8884";
    g.strokeRect(0.5, 0.5, w - 1, h - 1);
    const top = Math.max(0.001, ...history.map((p) => p.gbps));
    const x = (i) => w - 1 - (history.length - 1 - i) * (w - 2) / (kept - 1);
    const line = (color, value) => {
      g.strokeStyle = color;
      g.lineWidth = 1.5;
      g.beginPath();
      let open = false;
      history.forEach((p, i) => {
        const v = value(p);
        if (v === null) { open = false; return; }
        const y = h - 2 - v * (h - 4);
        if (open) g.lineTo(x(i), y); else g.moveTo(x(i), y);
        open = true;
      });
      g.stroke();
    };
    line("#2a9d5c", (p) => p.hit);
    line("#2f6fdf", (p) => p.gbps / top);
    g.fillStyle = "#2f6fdf";
    g.font = "10px system-ui";
    g.fillText(top.toFixed(2) + " GB/s", 4, 11);
    canvas.dataset.points = String(history.length);
    canvas.dataset.lastHitRate = history.length && history.at(-1).hit !== null ? String(history.at(-1).hit) : "";
  }

  function drawHeat(s) {
    const canvas = $("cache-heat");
    const cell = Math.max(1, Math.floor(320 / s.n_experts));
    const rowH = Math.max(2, Math.min(12, Math.floor(240 / s.n_layers)));
    canvas.width = cell * s.n_experts;
    canvas.height = rowH * s.n_layers;
    const g = canvas.getContext("2d");
    g.fillStyle = "#8882";
    g.fillRect(0, 0, canvas.width, canvas.height);
    g.fillStyle = "#e07b39";
    let resident = 0;
    const shares = [];
    s.resident.forEach((row, layer) => {
      let n = 0;
      for (let e = 0; e < row.length; ++e) {
        if (row[e] !== "1") continue;
        ++n;
        g.fillRect(e * cell, layer * rowH, cell, rowH - (rowH > 3 ? 1 : 0));
      }
      resident += n;
      shares.push(n / row.length);
    });
    canvas.dataset.layers = String(s.n_layers);
    canvas.dataset.experts = String(s.n_experts);
    canvas.dataset.resident = String(resident);
    const least = Math.min(...shares), most = Math.max(...shares);
    $("cache-heat-legend").textContent = "which experts hold a cache slot: a row per layer (" + s.n_layers +
      "), a column per expert (" + s.n_experts + "); " + resident + " resident, " +
      (100 * least).toFixed(0) + "-" + (100 * most).toFixed(0) + "% of a layer";
  }

  async function poll() {
    let s;
    try {
      const r = await fetch("/expert-cache");
      s = await r.json();
    } catch (e) {
      return;
    }
    const panel = $("cache");
    panel.dataset.streamed = String(s.streamed);
    if (!s.streamed) {
      $("cache-summary").textContent = "Experts " + s.description + ": every expert is always at hand, " +
        "nothing streams.";
      $("cache-live").hidden = true;
      return;
    }
    if (last && s.time_s > last.time_s) {
      const hits = s.hits - last.hits, lookups = hits + s.misses - last.misses;
      history.push({ hit: lookups > 0 ? hits / lookups : null,
                     gbps: (s.bytes_read - last.bytes_read) / (s.time_s - last.time_s) / 1e9 });
      if (history.length > kept) history.shift();
    }
    last = s;
    const now = history.length ? history.at(-1).gbps.toFixed(2) + " GB/s now, " : "";
    $("cache-summary").textContent = "hit rate " + (100 * s.hit_rate).toFixed(1) + "% (" + s.hits + " hits, " +
      s.misses + " misses); read " + now + bytes(s.bytes_read) + " in all; stall " +
      (1e3 * s.stall_seconds).toFixed(0) + " ms; " + s.evictions + " evictions; " + s.windows + " windows";
    $("cache-summary").dataset.hitRate = String(s.hit_rate);
    drawChart();
    drawHeat(s);
  }

  poll();
  setInterval(poll, 1000);
  return { poll };
})();
)script";

}  // namespace

std::string_view cache_panel_script() { return kPanelScript; }

}  // namespace strata::server
