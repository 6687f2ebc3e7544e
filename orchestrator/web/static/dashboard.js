// orch dashboard: live parts of the pages, by asking the server what changed. No framework:
// the server renders every fragment (escaped), this only swaps them in.
"use strict";

(function () {
  const poll = Number(document.body.dataset.pollMs) || 2000;
  const status = document.getElementById("live-status");

  function say(text) { if (status) status.textContent = text; }

  async function fetchJson(url) {
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(response.status + " " + response.statusText);
    return response.json();
  }

  function every(ms, task) {
    let stopped = false;
    async function tick() {
      if (stopped) return;
      try {
        if (!document.hidden) stopped = (await task()) === false;
        say("updated " + new Date().toLocaleTimeString());
      } catch (error) {
        say("cannot reach the dashboard (" + error.message + "); retrying");
      }
      if (!stopped) setTimeout(tick, ms);
    }
    setTimeout(tick, ms);
  }

  // An action asks first.
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }

  // The jobs page: its rows, as the server renders them for the same filters.
  const rows = document.querySelector("[data-live-rows]");
  if (rows) {
    every(poll, async function () {
      const response = await fetch(rows.dataset.liveRows, { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) throw new Error(String(response.status));
      const html = await response.text();
      if (html !== rows.dataset.last) { rows.innerHTML = html; rows.dataset.last = html; }
    });
  }

  // A job's page: its summary, events and checkpoints; its charts when what they draw changed.
  const live = document.getElementById("live");
  if (live) {
    every(poll, async function () {
      const data = await fetchJson(live.dataset.live);
      for (const [part, html] of Object.entries(data.parts)) {
        const target = document.querySelector('[data-part="' + part + '"]');
        if (target && target.innerHTML !== html) target.innerHTML = html;
      }
      if (data.version !== live.dataset.version) {
        live.dataset.version = data.version;
        for (const img of document.querySelectorAll("img[data-chart]")) {
          const next = new Image();
          next.onload = function () { img.src = next.src; };
          next.src = img.dataset.chart + "?v=" + encodeURIComponent(data.version);
        }
      }
      live.dataset.final = data.final ? "yes" : "no";
      return true;  // an ended job's page keeps listening: a teammate may resume it
    });
  }

  // A node's log, followed: only the bytes written since the last read.
  const log = document.getElementById("log");
  if (log) {
    const select = document.getElementById("log-node");
    const follow = document.getElementById("log-follow");
    let offset = null;
    function reset() { offset = null; log.textContent = ""; }
    select.addEventListener("change", reset);
    const LIMIT = 400000;  // characters kept on the page
    every(Math.max(1000, poll), async function () {
      let url = log.dataset.log + "?node=" + encodeURIComponent(select.value);
      if (offset !== null) url += "&offset=" + offset;
      const data = await fetchJson(url);
      if (!data.available) { log.textContent = "(no log of this node on this machine)"; return true; }
      if (data.restarted) log.textContent = "";
      if (data.text) {
        log.textContent += data.text;
        if (log.textContent.length > LIMIT) log.textContent = log.textContent.slice(-LIMIT);
        if (follow.checked) log.scrollTop = log.scrollHeight;
      }
      offset = data.offset;
      return true;
    });
  }
})();
