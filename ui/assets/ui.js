// rollgate viewer: the rollout list's first page refreshes itself, so new
// calls appear without a reload; copy buttons put their data-copy text
// (a rollgate bridge command) on the clipboard. Same-origin requests only
// (the page's Content-Security-Policy allows nothing else).
(function () {
  "use strict";
  // The Clipboard API needs a secure context (https or localhost); over
  // plain http elsewhere, copy through a selected, hidden text area.
  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) return navigator.clipboard.writeText(text);
    return new Promise(function (resolve, reject) {
      var ta = document.createElement("textarea");
      ta.value = text;
      ta.setAttribute("readonly", "");
      ta.className = "offscreen";
      document.body.appendChild(ta);
      ta.select();
      var ok = document.execCommand("copy");
      ta.remove();
      if (ok) resolve(); else reject(new Error("copy refused"));
    });
  }
  document.addEventListener("click", function (e) {
    var b = e.target.closest && e.target.closest("button.copy[data-copy]");
    if (!b) return;
    var label = b.dataset.label || b.textContent;
    b.dataset.label = label;
    copyText(b.dataset.copy).then(
      function () { b.textContent = "Copied"; b.dataset.copied = "1"; },
      function () { b.textContent = "Copy failed: select the text"; });
    setTimeout(function () { b.textContent = label; }, 2000);
  });
})();
(function () {
  "use strict";
  var table = document.getElementById("rollouts");
  if (!table || !table.dataset.live) return;
  var url = table.dataset.live + (table.dataset.live.indexOf("?") >= 0 ? "&" : "?") + "part=rows";
  var busy = false;
  function refresh() {
    if (busy || document.hidden) return;
    busy = true;
    // v: the store version the rows were read at; the server answers 204
    // while nothing was stored since (one cheap query, not the list's).
    fetch(url + "&v=" + encodeURIComponent(table.dataset.version || ""), { credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status !== 200) return null;
        table.dataset.version = r.headers.get("X-Rollgate-Version") || "";
        return r.text();
      })
      .then(function (html) {
        if (!html) return;
        var tpl = document.createElement("template");
        tpl.innerHTML = html.trim();
        var body = tpl.content.querySelector("tbody");
        var old = document.getElementById("rollout-rows");
        if (body && old && body.innerHTML !== old.innerHTML) {
          old.replaceWith(body);
          table.dataset.refreshed = String(Date.now());
        }
      })
      .catch(function () {})
      .then(function () { busy = false; });
  }
  setInterval(refresh, 2000);
})();
