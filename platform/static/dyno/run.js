// Run page: poll the run's status every second until it finishes, then reload for the results.
(function () {
  "use strict";
  const box = document.getElementById("run");
  if (!box || box.dataset.finished === "1") return;
  const url = box.dataset.statusUrl;
  const done = new Set(["succeeded", "failed", "cancelled"]);
  function render(run) {
    const status = document.getElementById("run-status");
    status.textContent = run.status;
    status.className = "badge " + run.status;
    document.getElementById("run-stage").textContent = run.stage;
    // The API no longer names the worker's host; the page keeps what the server rendered.
    if ("worker" in run) { document.getElementById("run-worker").textContent = run.worker || "—"; }
    const pct = Math.round(run.progress * 100);
    document.getElementById("run-bar").style.width = pct + "%";
    document.getElementById("run-percent").textContent = pct + "%";
    const err = document.getElementById("run-error");
    if (run.error) { err.hidden = false; err.textContent = run.error; }
    const log = document.getElementById("run-log");
    log.replaceChildren(...run.events.map(e => {
      const li = document.createElement("li");
      li.className = e.level;
      const t = document.createElement("time");
      t.textContent = e.at.slice(11, 19);
      li.append(t, " " + e.message);
      return li;
    }));
  }
  async function tick() {
    try {
      const r = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (r.ok) {
        const run = await r.json();
        render(run);
        if (done.has(run.status)) { window.location.reload(); return; }
      }
    } catch (e) { /* the server restarting is not the run failing: keep polling */ }
    setTimeout(tick, 1000);
  }
  setTimeout(tick, 1000);
})();
