// Draws the billing pages' charts from the figure specs the server embedded beside each one
// (<div class="chart" data-figure="ID"> reads the json_script block #ID).
(function () {
  "use strict";
  if (typeof Plotly === "undefined") { return; }  // the table beside each chart still shows every figure
  document.querySelectorAll("div.chart[data-figure]").forEach(function (div) {
    var source = document.getElementById(div.dataset.figure);
    if (!source) { return; }
    var figure = JSON.parse(source.textContent);
    div.textContent = "";
    Plotly.newPlot(div, figure.data, figure.layout, { displaylogo: false, responsive: true });
  });
})();
