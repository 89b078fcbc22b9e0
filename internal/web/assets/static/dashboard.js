// The dashboard's only script: it swaps in the server-rendered live part
// every few seconds, and posts the actions with the token.
(function () {
  "use strict";
  var refresh = parseInt(document.body.dataset.refresh, 10) || 2000;
  var live = document.getElementById("live");
  var counter = document.getElementById("refreshes");
  var msg = document.getElementById("msg");
  var tokenInput = document.getElementById("token");
  if (tokenInput) {
    tokenInput.value = sessionStorage.getItem("compartment-token") || "";
    tokenInput.addEventListener("change", function () {
      sessionStorage.setItem("compartment-token", tokenInput.value);
    });
  }

  function update() {
    return fetch("/live", {cache: "no-store"})
      .then(function (r) { return r.text(); })
      .then(function (html) {
        live.innerHTML = html;
        var n = parseInt(counter.dataset.n, 10) + 1;
        counter.dataset.n = n;
        counter.textContent = n;
      })
      .catch(function (e) { msg.textContent = "refresh failed: " + e; });
  }

  function tick() { update().finally(function () { setTimeout(tick, refresh); }); }
  setTimeout(tick, refresh);

  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("button.act");
    if (!b) { return; }
    var form = new URLSearchParams();
    ["pool", "queue", "id"].forEach(function (k) { if (b.dataset[k]) { form.set(k, b.dataset[k]); } });
    var headers = {"Content-Type": "application/x-www-form-urlencoded"};
    if (tokenInput && tokenInput.value) { headers["X-Compartment-Token"] = tokenInput.value; }
    fetch("/actions/" + b.dataset.action, {method: "POST", headers: headers, body: form.toString()})
      .then(function (r) {
        return r.text().then(function (t) {
          msg.textContent = t;
          msg.className = r.ok ? "ok" : "refused";
        });
      })
      .then(update);
  });
})();
