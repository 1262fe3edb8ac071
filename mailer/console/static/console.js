// fairpost console: the live parts of a page. An element with data-live="URL"
// is replaced by what URL answers every data-every seconds while the page is
// visible. A session that ended (401) sends the page to the login.
(function () {
  "use strict";

  function refresh(element) {
    fetch(element.dataset.live, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (response.status === 401) {
          window.location.reload();
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html !== null) {
          element.innerHTML = html;
          element.dataset.refreshed = String(Date.now());
        }
      })
      .catch(function () {
        // The console or the network is away: keep what is shown, try again next time.
      });
  }

  document.querySelectorAll("[data-live]").forEach(function (element) {
    var every = Math.max(0.2, Number(element.dataset.every) || 5) * 1000;
    window.setInterval(function () {
      if (!document.hidden) {
        refresh(element);
      }
    }, every);
  });
})();
