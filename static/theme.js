// Theme: follows the system unless the user chose light or dark with the toggle (kept in localStorage).
// Loaded in <head> without defer so the page never flashes the other theme.
(function () {
  var KEY = "tally-theme", MODES = ["auto", "dark", "light"];
  var LABELS = {auto: "Theme: system", dark: "Theme: dark", light: "Theme: light"};
  function stored() { try { return localStorage.getItem(KEY) || "auto"; } catch (e) { return "auto"; } }
  function apply(mode) {
    if (mode === "auto") document.documentElement.removeAttribute("data-theme");
    else document.documentElement.setAttribute("data-theme", mode);
    var button = document.getElementById("theme-toggle");
    if (button) { button.textContent = "◐ " + LABELS[mode].split(": ")[1]; button.title = LABELS[mode] + " (click to change)"; }
  }
  apply(stored());
  document.addEventListener("DOMContentLoaded", function () {
    apply(stored());
    var button = document.getElementById("theme-toggle");
    if (!button) return;
    button.addEventListener("click", function () {
      var next = MODES[(MODES.indexOf(stored()) + 1) % MODES.length];
      try { localStorage.setItem(KEY, next); } catch (e) {}
      apply(next);
    });
  });
})();
