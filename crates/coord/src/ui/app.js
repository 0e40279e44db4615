// Refreshes the parts of a page marked data-live="URL" every 3 seconds,
// while the page is visible, unless the reader is busy there: a detail
// open, a box ticked, a field typed in or focused.
(function () {
  function busy(el) {
    if (el.querySelector("details[open]")) return true;
    if (el.contains(document.activeElement) && document.activeElement !== el &&
        /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement.tagName)) return true;
    var fields = el.querySelectorAll("input, textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) return true;
      } else if (f.tagName === "SELECT") {
        for (var j = 0; j < f.options.length; j++) {
          if (f.options[j].selected !== f.options[j].defaultSelected) return true;
        }
      } else if (f.value !== f.defaultValue) {
        return true;
      }
    }
    return false;
  }
  function refresh() {
    if (document.hidden) return;
    document.querySelectorAll("[data-live]").forEach(function (el) {
      if (busy(el)) return;
      fetch(el.getAttribute("data-live"), { credentials: "same-origin" })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) { if (html !== null && !busy(el)) el.innerHTML = html; })
        .catch(function () {});
    });
  }
  setInterval(refresh, 3000);
})();
