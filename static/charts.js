/* Draws the pipeline page's lag and throughput charts with uPlot from the server's JSON (no build step).
   The x axis spans the chosen range (so one sample sits in its hour, not across years); y starts at 0;
   samples are drawn as points too, so a single one is visible and throughput fills under its line. */
(function () {
  "use strict";
  var node = document.getElementById("chart-data");
  if (!node || typeof uPlot === "undefined") return;
  var data = JSON.parse(node.textContent);
  function yRange(u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; }
  document.querySelectorAll("[data-series]").forEach(function (el) {
    var series = data[el.dataset.series] || [];
    var width = Math.max(280, el.clientWidth || el.parentNode.clientWidth - 12);
    var opts = {
      width: width, height: 180,
      scales: {x: {time: true, range: function () { return [data.from, data.to]; }}, y: {range: yRange}},
      series: [{}, {label: el.dataset.label, stroke: "#1f5fa8", fill: "rgba(31,95,168,0.18)", width: 2,
                    spanGaps: true, points: {show: true, size: 5}}],
      axes: [{space: 80, stroke: "currentColor"}, {size: 60, stroke: "currentColor"}],
      legend: {show: true},
      hooks: {setScale: [function (u, key) {
        if (key === "x") el.dataset.span = String(Math.round(u.scales.x.max - u.scales.x.min));  // seconds shown
      }]},
    };
    var chart = new uPlot(opts, [data.t, series], el);
    el.dataset.drawn = String(series.filter(function (v) { return v !== null; }).length);
    window.addEventListener("resize", function () {
      chart.setSize({width: Math.max(280, el.parentNode.clientWidth - 12), height: 180});
    });
  });
})();
