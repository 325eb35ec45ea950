(function () {
  var base = new URLSearchParams(location.search).get("viewer") || "__VIEWER_URL__";
  base = base.replace(/\/+$/, "");
  if (!/^https?:\/\//.test(base) || !window.fetch) return;
  var runs = JSON.parse(document.getElementById("cts-viewer-runs").textContent);
  function link(text, query) {
    var a = document.createElement("a");
    a.href = base + "/#/?" + new URLSearchParams(query);
    a.className = "viewer-link";
    a.textContent = text;
    return a;
  }
  fetch(base + "/api/ping", { mode: "no-cors", cache: "no-store" }).then(function () {
    var list = document.getElementById("cts-viewer-links");
    document.getElementById("cts-viewer-url").textContent = base;
    runs.forEach(function (run) {
      var item = document.createElement("li");
      item.append(link(run.name, { runpath: run.path }), " · ",
        link("failed records", { runpath: run.path, failed: "1" }));
      list.append(item);
    });
    document.querySelectorAll("table").forEach(function (table) {
      var head = Array.prototype.map.call(table.rows[0].cells, function (c) {
        return c.textContent;
      });
      Array.prototype.slice.call(table.rows, 1).forEach(function (row) {
        var run = runs.find(function (r) { return r.name === row.cells[0].textContent; });
        if (!run) return;
        Array.prototype.forEach.call(row.cells, function (cell, i) {
          var query = { runpath: run.path };
          if (i > 0 && head[i].indexOf("@") < 0 && ["blurred", "oracle"].indexOf(head[i]) < 0)
            return;
          if (i > 0) query.condition = head[i];
          cell.append(" ", link("↗", query));
        });
      });
    });
    document.getElementById("cts-viewer").hidden = false;
  }, function () {});
})();
