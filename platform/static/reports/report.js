// Draws the report page's charts from the figure specs the server embedded (#report-charts).
(function () {
  "use strict";
  var source = document.getElementById("report-charts");
  if (!source || typeof Plotly === "undefined") { return; }
  var figures = JSON.parse(source.textContent);
  var config = { responsive: true, displaylogo: false };
  document.querySelectorAll("[data-chart]").forEach(function (element) {
    var figure = figures[element.dataset.chart];
    if (figure) { Plotly.newPlot(element, figure.data, figure.layout, config); }
  });
})();
