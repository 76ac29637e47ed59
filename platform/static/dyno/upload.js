// Upload page: drag-and-drop of files or a whole folder, keeping each file's relative path.
(function () {
  "use strict";
  const form = document.getElementById("upload-form");
  const drop = document.getElementById("drop");
  const picker = document.getElementById("files");
  const folder = document.getElementById("folder");
  const chosen = document.getElementById("chosen");
  let entries = [];  // [{file, path}]

  function show() {
    chosen.replaceChildren(...entries.map(e => {
      const li = document.createElement("li");
      li.textContent = `${e.path} (${e.file.size.toLocaleString()} bytes)`;
      return li;
    }));
  }
  function setFrom(fileList) {
    entries = Array.from(fileList).map(f => ({ file: f, path: f.webkitRelativePath || f.name }));
    show();
  }
  async function walk(entry, prefix, out) {
    if (entry.isFile) {
      const file = await new Promise((ok, bad) => entry.file(ok, bad));
      out.push({ file, path: prefix + file.name });
    } else if (entry.isDirectory) {
      const reader = entry.createReader();
      let batch;
      do {
        batch = await new Promise((ok, bad) => reader.readEntries(ok, bad));
        for (const child of batch) await walk(child, prefix + entry.name + "/", out);
      } while (batch.length);
    }
  }
  picker.addEventListener("change", () => setFrom(picker.files));
  folder.addEventListener("change", () => setFrom(folder.files));
  ["dragenter", "dragover"].forEach(t => drop.addEventListener(t, e => { e.preventDefault(); drop.classList.add("over"); }));
  ["dragleave", "drop"].forEach(t => drop.addEventListener(t, () => drop.classList.remove("over")));
  drop.addEventListener("drop", async e => {
    e.preventDefault();
    const out = [];
    const items = Array.from(e.dataTransfer.items || []).map(i => i.webkitGetAsEntry && i.webkitGetAsEntry()).filter(Boolean);
    if (items.length) { for (const it of items) await walk(it, "", out); entries = out; show(); }
    else setFrom(e.dataTransfer.files);
  });
  form.addEventListener("submit", e => {
    if (!entries.length) return;  // plain form submit with the picker's files
    e.preventDefault();
    const data = new FormData();
    data.append("csrfmiddlewaretoken", form.querySelector("[name=csrfmiddlewaretoken]").value);
    data.append("name", form.querySelector("[name=name]").value);
    for (const { file, path } of entries) { data.append("files", file, file.name); data.append("paths", path); }
    document.getElementById("upload-submit").disabled = true;
    fetch(form.action || window.location.href, { method: "POST", body: data, credentials: "same-origin" })
      .then(r => r.text().then(html => ({ r, html })))
      .then(({ r, html }) => {
        if (r.redirected) { window.location.href = r.url; return; }
        document.open(); document.write(html); document.close();
      });
  });
})();
