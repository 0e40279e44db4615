// Refreshes the parts of a page marked data-live="URL" every 3 seconds,
// while the page is visible, unless the reader has a detail open there.
(function () {
  function refresh() {
    if (document.hidden) return;
    document.querySelectorAll("[data-live]").forEach(function (el) {
      if (el.querySelector("details[open]")) return;
      fetch(el.getAttribute("data-live"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null) el.innerHTML = html; })
        .catch(function () {});
    });
  }
  setInterval(refresh, 3000);
})();
