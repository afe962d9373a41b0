// Fray dashboard: draws the Utilisation page's charts with uPlot from /data/utilisation,
// and redraws them at the controller's sampling interval. The server shapes the data
// (fray.cluster.server.dashboard.charts.chart_data); this only hands it to uPlot.
(function () {
  var root = document.getElementById('charts');
  if (!root || typeof uPlot === 'undefined') { return; }
  var colours = ['#4285f4', '#5f6368', '#fbbc04', '#34a853', '#ea4335', '#9334e6', '#fa7b17', '#12b5cb'];
  var drawn = {};

  function draw(data) {
    data.charts.forEach(function (chart) {
      var el = document.getElementById('chart-' + chart.id);
      if (!el) { return; }
      var series = [{}].concat(chart.series.map(function (s, i) {
        return { label: s.label, stroke: s.colour || colours[i % colours.length], width: s.width || 2, spanGaps: false };
      }));
      var columns = [data.t].concat(chart.series.map(function (s) { return s.values; }));
      var old = drawn[chart.id];
      el.dataset.points = String(data.t.length);
      if (old && old.series.length === series.length) { old.setData(columns); return; }
      if (old) { old.destroy(); }
      var opts = {
        width: Math.max(300, el.clientWidth || 600), height: 220, series: series,
        axes: [{}, { label: chart.unit }], scales: { y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } }
      };
      drawn[chart.id] = new uPlot(opts, columns, el);
    });
    root.dataset.samples = String(data.t.length);
  }

  function refresh() {
    fetch(root.dataset.source, { credentials: 'same-origin' })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(function (data) {
        draw(data);
        setTimeout(refresh, Math.max(1000, data.interval * 1000));
      })
      .catch(function () { setTimeout(refresh, 10000); });
  }
  refresh();
})();
