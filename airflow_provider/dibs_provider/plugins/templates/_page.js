// The Reservations page inside Airflow's UI (Browse -> Reservations), which shows it in a frame of
// the same origin. Three things only the page's own script can do from in there:
//  1. look like Airflow: copy the colours, fonts and radii of Airflow's theme (its Chakra variables)
//     and follow its light or dark mode as the user switches it;
//  2. open Airflow's pages (a task, a DAG run) in Airflow itself, not in the frame: Airflow's frame
//     may not navigate the window around it (its sandbox), so the page hands the route to Airflow's
//     router (its history, then a popstate, as the browser's back button does);
//  3. open at the key a link names: Airflow before 3.3.2 gives its frames no deep link, so a link to
//     /plugin/dibs?key=... reaches the page only through the address of the UI around it.
// Without Airflow around it (the page opened on its own) it follows the system's light or dark mode.
(() => {
  "use strict";
  const root = document.documentElement;
  let host = null;
  try {
    if (window.parent !== window && window.parent.document.documentElement) host = window.parent;
  } catch (error) {
    host = null; // another origin: not Airflow's UI
  }
  const hostRoot = host && host.document.documentElement;
  const airflow = !!hostRoot && host.getComputedStyle(hostRoot).getPropertyValue("--chakra-colors-bg").trim() !== "";
  const TOKENS = {
    "--bg": "--chakra-colors-bg", "--bg-subtle": "--chakra-colors-bg-subtle", "--bg-muted": "--chakra-colors-bg-muted",
    "--fg": "--chakra-colors-fg", "--muted": "--chakra-colors-fg-muted", "--subtle": "--chakra-colors-fg-subtle",
    "--border": "--chakra-colors-border", "--border-strong": "--chakra-colors-border-emphasized",
    "--link": "--chakra-colors-fg-info", "--error": "--chakra-colors-fg-error", "--ok": "--chakra-colors-fg-success",
    "--held": "--chakra-colors-fg-info", "--font": "--chakra-fonts-body", "--mono": "--chakra-fonts-mono",
    "--radius": "--chakra-radii-l2",
  };
  const system = window.matchMedia("(prefers-color-scheme: dark)");

  function follow() {
    if (!airflow) {
      root.dataset.theme = system.matches ? "dark" : "light";
      return;
    }
    root.dataset.theme = hostRoot.classList.contains("dark") ? "dark" : "light";
    const theirs = host.getComputedStyle(hostRoot);
    for (const [ours, name] of Object.entries(TOKENS)) {
      const value = theirs.getPropertyValue(name).trim();
      if (value) root.style.setProperty(ours, value);
      else root.style.removeProperty(ours);
    }
  }
  follow();
  if (airflow) new MutationObserver(follow).observe(hostRoot, { attributes: true, attributeFilter: ["class", "style"] });
  else system.addEventListener("change", follow);

  // 2. Airflow's own pages, in Airflow's window.
  document.addEventListener("click", (event) => {
    const link = event.target instanceof Element ? event.target.closest("a[data-airflow]") : null;
    if (!link || !airflow || event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return; // a new tab: the browser's
    event.preventDefault();
    try {
      const state = host.history.state || {};
      host.history.pushState({ usr: null, key: Math.random().toString(36).slice(2, 10), idx: (state.idx || 0) + 1 }, "", link.href);
      host.dispatchEvent(new host.PopStateEvent("popstate", { state: host.history.state }));
    } catch (error) {
      window.open(link.href, "_top");
    }
  });

  // 3. A link to /plugin/dibs?key=... on an Airflow that does not hand its frame the query: once, as
  // the frame opens (its name outlives the frame's navigations; the address around it does not change).
  if (airflow && !window.location.search && window.name !== "dibs-reservations") {
    window.name = "dibs-reservations";
    const wanted = new URLSearchParams(host.location.search);
    if (["key", "name", "state", "conn"].some((name) => wanted.has(name))) {
      window.location.replace(window.location.pathname + "?" + wanted.toString());
    }
  }
})();
