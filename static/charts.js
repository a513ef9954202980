/* Draws the pipeline page's lag and throughput charts with uPlot from the server's JSON (no build step). */
(function () {
  "use strict";
  var node = document.getElementById("chart-data");
  if (!node || typeof uPlot === "undefined") return;
  var data = JSON.parse(node.textContent);
  document.querySelectorAll("[data-series]").forEach(function (el) {
    var series = data[el.dataset.series] || [];
    var width = Math.max(280, el.clientWidth || el.parentNode.clientWidth - 12);
    var opts = {
      width: width, height: 180,
      series: [{}, {label: el.dataset.label, stroke: "#1f5fa8", fill: "rgba(31,95,168,0.10)", width: 2,
                    spanGaps: true}],
      axes: [{}, {size: 60}],
      legend: {show: true},
    };
    var chart = new uPlot(opts, [data.t, series], el);
    window.addEventListener("resize", function () {
      chart.setSize({width: Math.max(280, el.parentNode.clientWidth - 12), height: 180});
    });
  });
})();
