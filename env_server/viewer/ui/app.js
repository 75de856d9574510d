// The mathdebate debate viewer (served at /ui; env_server/routes_ui.py, env_server/view.py).
//
// Safety: model text (problems, turns, prompts, answers) is only ever inserted as text
// (textContent, Text nodes, Element.append of strings), never as HTML. Math spans go through
// KaTeX's DOM renderer with trust: false and throwOnError: false; the page runs under
// Content-Security-Policy: default-src 'self' (no inline script or style attributes).
"use strict";

(function () {
  const KATEX_OPTIONS = { throwOnError: false, trust: false, strict: "ignore", maxSize: 50, maxExpand: 1000 };
  const MAX_MATH = 2000; // longest math span, characters; longer stays text
  const REFRESH_MS = 3000; // live panel period
  const SOURCE_KINDS = new Set(["requests", "deduplicated", "timeouts", "worker_deaths", "pool_restarts"]);
  const ANSWER_SITES = new Set(["wrong_answer", "unparseable_answer", "repeated_rejected_answer", "grading_timeout"]);
  const VERDICT_SITES = new Set(["false_accept", "false_reject"]);
  const VERDICT = /VERDICT\s*[:：]\s*(?:CORRECT|INCORRECT)/gi;

  const state = { hints: {}, kinds: new Set(), current: null, obsT: 0, lastStats: null };

  // ------------------------------------------------------------------ DOM helpers

  function $(id) {
    return document.getElementById(id);
  }

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function showError(message) {
    const banner = $("error");
    banner.textContent = message || "";
    banner.hidden = !message;
  }

  function fmt(value) {
    if (typeof value !== "number") return String(value);
    return Number.isInteger(value) ? String(value) : String(Math.round(value * 1000) / 1000);
  }

  // ------------------------------------------------------------------ HTTP

  class HttpError extends Error {
    constructor(status, url) {
      super(`${status} from ${url}`);
      this.status = status;
    }
  }

  async function getJSON(url) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new HttpError(response.status, url);
    return response.json();
  }

  function reportFailure(err) {
    if (err instanceof HttpError && err.status === 401) {
      showError("Unauthorized: open this page once as /ui?token=<MATHDEBATE_AUTH_TOKEN> (it sets a cookie).");
    } else {
      showError(String(err && err.message ? err.message : err));
    }
  }

  // ------------------------------------------------------------------ math

  function isSpace(c) {
    return c === " " || c === "\t" || c === "\n" || c === "\r";
  }

  function isDigit(c) {
    return c !== undefined && c >= "0" && c <= "9";
  }

  // End of an inline $...$ opened before `start` (pandoc's rule: no space after the opening $,
  // none before the closing one, no digit right after it; within one paragraph), else -1.
  function inlineDollarEnd(text, start) {
    const stop = Math.min(text.length, start + MAX_MATH);
    for (let k = start; k < stop; k++) {
      const c = text[k];
      if (c === "\\") {
        k++;
      } else if (c === "\n" && text[k + 1] === "\n") {
        return -1;
      } else if (c === "$") {
        return k > start && !isSpace(text[k - 1]) && !isDigit(text[k + 1]) ? k : -1;
      }
    }
    return -1;
  }

  // Index of the brace closing the one at `open`, else -1.
  function braceEnd(text, open) {
    const stop = Math.min(text.length, open + MAX_MATH);
    let depth = 0;
    for (let k = open; k < stop; k++) {
      const c = text[k];
      if (c === "\\") k++;
      else if (c === "{") depth++;
      else if (c === "}" && --depth === 0) return k;
    }
    return -1;
  }

  // Text and math segments: $$..$$, \[..\], \(..\), $..$ and bare \boxed{...}.
  function splitMath(text) {
    const out = [];
    const absent = new Set(); // closing delimiters that do not occur any more
    let buf = "";
    let i = 0;
    function closing(delim, from) {
      if (absent.has(delim)) return -1;
      const j = text.indexOf(delim, from);
      if (j < 0) absent.add(delim);
      return j;
    }
    function push(tex, display, raw, boxed) {
      if (buf) out.push({ text: buf });
      buf = "";
      out.push({ tex, display, raw, boxed });
    }
    while (i < text.length) {
      const c = text[i];
      const next = text[i + 1];
      if (c === "\\" && next === "$") {
        buf += "\\$";
        i += 2;
        continue;
      }
      if (c === "$" && next === "$") {
        const j = closing("$$", i + 2);
        if (j > i + 2 && j - i <= MAX_MATH) {
          push(text.slice(i + 2, j), true, text.slice(i, j + 2), false);
          i = j + 2;
          continue;
        }
      } else if (c === "\\" && (next === "[" || next === "(")) {
        const close = next === "[" ? "\\]" : "\\)";
        const j = closing(close, i + 2);
        if (j > i + 2 && j - i <= MAX_MATH) {
          push(text.slice(i + 2, j), next === "[", text.slice(i, j + 2), false);
          i = j + 2;
          continue;
        }
      } else if (c === "$" && next !== undefined && !isSpace(next)) {
        const j = inlineDollarEnd(text, i + 1);
        if (j > 0) {
          push(text.slice(i + 1, j), false, text.slice(i, j + 1), false);
          i = j + 1;
          continue;
        }
      } else if (c === "\\" && text.startsWith("\\boxed{", i)) {
        const j = braceEnd(text, i + 6);
        if (j > 0) {
          push(text.slice(i, j + 1), false, text.slice(i, j + 1), true);
          i = j + 1;
          continue;
        }
      }
      buf += c;
      i += 1;
    }
    if (buf) out.push({ text: buf });
    return out;
  }

  function renderTex(span, tex, display, raw) {
    if (window.katex) {
      try {
        window.katex.render(tex, span, Object.assign({}, KATEX_OPTIONS, { displayMode: display }));
        return;
      } catch (err) {
        // fall through: show the source as text
      }
    }
    span.textContent = raw;
  }

  // Append `text` to `container`: text as Text nodes, math rendered by KaTeX. With `markLastBox`
  // the last \boxed{} (the answer an error marker is about) is highlighted as the error site.
  function renderMath(container, text, markLastBox) {
    const segments = splitMath(text);
    let last = -1;
    if (markLastBox) segments.forEach((seg, k) => { if (seg.boxed) last = k; });
    segments.forEach((seg, k) => {
      if (seg.text !== undefined) {
        container.appendChild(document.createTextNode(seg.text));
        return;
      }
      const span = el("span", seg.display ? "math display" : "math");
      if (k === last) {
        span.classList.add("error-site");
        span.title = "error site";
      }
      renderTex(span, seg.tex, seg.display, seg.raw);
      container.appendChild(span);
    });
  }

  // A turn's text with its error site highlighted: the last boxed answer of a wrong solver or
  // judge answer, the verdict of a wrong verifier verdict.
  function renderTurnContent(container, turn, reward) {
    const kind = reward ? reward.error_kind : null;
    if (kind && VERDICT_SITES.has(kind)) {
      let match = null;
      for (const m of turn.content.matchAll(VERDICT)) match = m;
      if (match) {
        renderMath(container, turn.content.slice(0, match.index), false);
        const site = el("mark", "error-site", match[0]);
        site.title = "error site";
        container.appendChild(site);
        renderMath(container, turn.content.slice(match.index + match[0].length), false);
        return;
      }
    }
    renderMath(container, turn.content, Boolean(kind && ANSWER_SITES.has(kind)));
  }

  // ------------------------------------------------------------------ live panel

  function gradingQueue(grading) {
    // answers sent to a grading worker and not graded yet: requests minus de-duplicated ones
    // minus those decided (each decided grade counts once under its source)
    let decided = 0;
    for (const [key, value] of Object.entries(grading)) {
      if (!SOURCE_KINDS.has(key) && !key.startsWith("kind:")) decided += value;
    }
    return Math.max(0, (grading.requests || 0) - (grading.deduplicated || 0) - decided);
  }

  async function pollStats() {
    let stats;
    try {
      const response = await fetch("/stats", { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (response.status === 404) { // mathdebate view: no live server
        $("live").hidden = true;
        return false;
      }
      if (!response.ok) throw new HttpError(response.status, "/stats");
      stats = await response.json();
    } catch (err) {
      reportFailure(err);
      return true;
    }
    const now = performance.now();
    $("live").hidden = false;
    $("live-sessions").textContent = fmt(stats.sessions);
    $("live-graded").textContent = fmt(stats.episodes_graded);
    $("live-retained").textContent = fmt(stats.episodes);
    $("live-queue").textContent = fmt(gradingQueue(stats.grading || {}));
    if (state.lastStats) {
      const seconds = (now - state.lastStats.at) / 1000;
      const rate = seconds > 0 ? (stats.steps - state.lastStats.steps) / seconds : 0;
      $("live-rate").textContent = rate.toFixed(1);
    }
    state.lastStats = { at: now, steps: stats.steps };
    $("live-updated").textContent = "updated " + new Date().toLocaleTimeString([], { hour12: false });
    return true;
  }

  async function liveLoop() {
    if (await pollStats()) setTimeout(liveLoop, REFRESH_MS);
  }

  // ------------------------------------------------------------------ episode list

  function addKinds(kinds) {
    const select = $("filters").elements.error_kind;
    for (const kind of kinds) {
      if (state.kinds.has(kind)) continue;
      state.kinds.add(kind);
      const option = el("option", null, kind);
      option.value = kind;
      select.appendChild(option);
    }
  }

  function episodeHref(id) {
    return "#/episode/" + encodeURIComponent(id);
  }

  function rewardClass(reward) {
    return reward >= 1 ? "good" : reward <= 0 ? "bad" : "mid";
  }

  async function loadList() {
    const form = $("filters");
    const params = new URLSearchParams();
    for (const name of ["problem_id", "error_kind", "min_reward", "max_reward", "limit"]) {
      const value = form.elements[name].value.trim();
      if (value) params.set(name, value);
    }
    let data;
    try {
      data = await getJSON("/episodes?" + params.toString());
    } catch (err) {
      reportFailure(err);
      return;
    }
    showError("");
    const body = $("episodes").tBodies[0];
    clear(body);
    for (const summary of data.episodes) {
      const row = el("tr");
      row.dataset.episode = summary.episode_id;
      const id = summary.episode_id;
      const link = el("a", null, id.length > 10 ? id.slice(0, 8) + "…" : id);
      link.href = episodeHref(id);
      link.title = id;
      const idCell = el("td");
      idCell.appendChild(link);
      const kinds = el("td", "kinds");
      for (const kind of summary.error_kinds) kinds.appendChild(el("span", "tag", kind));
      addKinds(summary.error_kinds);
      const graded = new Date(summary.graded_at * 1000);
      const problem = el("td", "problem-id");
      summary.problem_id.split("/").forEach((part, k) => {
        if (k > 0) problem.append("/", document.createElement("wbr")); // break long ids after a slash
        problem.append(part);
      });
      row.append(idCell, problem,
        el("td", "reward " + rewardClass(summary.episode_reward), fmt(summary.episode_reward)), kinds,
        el("td", "num", summary.turns + (summary.mode === "single" ? " (single)" : "")),
        el("td", "muted num", graded.toLocaleTimeString([], { hour12: false })));
      body.appendChild(row);
    }
    $("empty").hidden = data.episodes.length > 0;
    markSelected();
  }

  function markSelected() {
    const id = state.current ? state.current.episode_id : null;
    for (const row of $("episodes").tBodies[0].rows) row.classList.toggle("selected", row.dataset.episode === id);
  }

  // ------------------------------------------------------------------ one debate

  function correctnessLabel(role, correct) {
    if (role === "verifier") return correct ? "✓ verdict right" : "✗ verdict wrong";
    return correct ? "✓ answer correct" : "✗ answer wrong";
  }

  function turnItem(turn, reward) {
    const item = el("li", "turn role-" + turn.role);
    item.dataset.t = String(turn.t);
    const head = el("div", "turn-head");
    head.append(el("span", "role", turn.role), el("span", "muted", `t=${turn.t} · round ${turn.round}`));
    if (turn.policy) head.appendChild(el("span", "policy", turn.policy));
    if (reward) {
      head.appendChild(el("span", "reward-value", "reward " + fmt(reward.reward)));
      if (reward.correct !== null && reward.correct !== undefined) {
        head.appendChild(el("span", "correct " + (reward.correct ? "yes" : "no"), correctnessLabel(turn.role, reward.correct)));
      }
      if (reward.answer !== null && reward.answer !== undefined) {
        const answer = el("span", "answer", "answer ");
        const tex = el("span", "math");
        renderTex(tex, reward.answer, false, reward.answer);
        answer.appendChild(tex);
        head.appendChild(answer);
      }
    }
    const content = el("div", "content");
    renderTurnContent(content, turn, reward);
    item.append(head, content);
    if (reward && reward.error_kind) {
      item.classList.add("has-error");
      const marker = el("div", "marker");
      marker.appendChild(el("span", "kind", "⚑ " + reward.error_kind));
      if (reward.hint_template_key) {
        marker.appendChild(el("code", "hint-key", reward.hint_template_key));
        // the turn's own localised hint (RFC 0002) where the server gives one, else the template
        const hint = reward.hint || state.hints[reward.hint_template_key];
        if (hint) marker.appendChild(el("p", "hint", hint));
      }
      item.appendChild(marker);
    }
    return item;
  }

  function factValue(value) {
    if (value === null || value === undefined) return "–";
    if (typeof value === "boolean") return value ? "yes" : "no";
    if (typeof value === "object") return Object.entries(value).map(([k, v]) => `${k} ${fmt(v)}`).join(" · ");
    return fmt(value);
  }

  function renderFinal(record) {
    const section = $("d-final");
    section.hidden = !record;
    if (!record) return;
    const badge = $("d-reward");
    badge.textContent = fmt(record.episode_reward);
    badge.className = "badge " + rewardClass(record.episode_reward);
    const facts = $("d-facts");
    clear(facts);
    for (const [key, value] of Object.entries(record.facts)) {
      facts.append(el("dt", null, key.replace(/_/g, " ")), el("dd", null, factValue(value)));
    }
  }

  async function openEpisode(id) {
    let view;
    try {
      view = await getJSON("/episodes/" + encodeURIComponent(id));
    } catch (err) {
      if (err instanceof HttpError && err.status === 404) showError(`Episode ${id} is unknown or no longer retained.`);
      else reportFailure(err);
      return;
    }
    showError("");
    state.current = view;
    $("placeholder").hidden = true;
    const section = $("debate");
    section.hidden = false;
    section.dataset.episode = view.episode_id;
    $("d-episode").textContent = view.episode_id;
    $("d-problem-id").textContent = view.problem_id;
    $("d-mode").textContent = view.mode + " mode";
    $("d-status").textContent = view.graded ? "graded" : view.done ? "grading pending" : "in progress";
    const problem = $("d-problem");
    clear(problem);
    if (view.problem) renderMath(problem, view.problem, false);
    else problem.appendChild(el("span", "muted", "(the problem statement is not in this file)"));
    const gold = $("d-gold");
    gold.hidden = view.gold === null || view.gold === undefined;
    const goldTex = gold.querySelector("span");
    clear(goldTex);
    if (!gold.hidden) renderTex(goldTex, view.gold, false, view.gold);
    const rewards = new Map((view.rewards ? view.rewards.turns : []).map((r) => [r.t, r]));
    const turns = $("d-turns");
    clear(turns);
    for (const turn of view.turns) turns.appendChild(turnItem(turn, rewards.get(turn.t)));
    renderFinal(view.rewards);
    const canStep = view.max_t !== null && view.max_t !== undefined && view.max_t >= 0;
    $("d-obs").hidden = !canStep;
    markSelected();
    if (canStep) {
      state.obsT = 0;
      await loadObservation();
    }
  }

  function messageBlock(message) {
    const block = el("div", "msg msg-" + message.role);
    block.append(el("span", "msg-role", message.role), el("div", "msg-content", message.content));
    return block;
  }

  async function loadObservation() {
    const view = state.current;
    const t = state.obsT;
    $("obs-label").textContent = `t = ${t} of 0…${view.max_t}`;
    $("obs-prev").disabled = t <= 0;
    $("obs-next").disabled = t >= view.max_t;
    for (const item of $("d-turns").children) item.classList.toggle("stepping", item.dataset.t === String(t));
    let data;
    try {
      data = await getJSON(`/state?episode_id=${encodeURIComponent(view.episode_id)}&t=${t}`);
    } catch (err) {
      reportFailure(err);
      return;
    }
    if (state.current !== view || state.obsT !== t) return; // a newer request took over
    const payload = data.observation || {};
    const obs = payload.observation || payload;
    const body = $("obs-body");
    clear(body);
    const summary = el("p", "obs-summary");
    summary.append("to act: ", el("strong", "role-name", obs.role || "nobody"), ` · round ${obs.round} · `,
      `${(obs.transcript || []).length} turn(s) in the transcript`);
    const meta = payload.metadata || obs.metadata;
    if (meta && meta.turn !== null && meta.turn !== undefined) {
      summary.append(` · after turn ${meta.turn} (${meta.role})`);
      if (meta.error_kind) summary.append(", provisional marker ", el("code", null, meta.error_kind));
    }
    body.appendChild(summary);
    const messages = el("div", "messages");
    for (const message of obs.messages || []) messages.appendChild(messageBlock(message));
    body.appendChild(messages);
  }

  function step(delta) {
    const view = state.current;
    if (!view || view.max_t === null) return;
    const t = Math.min(view.max_t, Math.max(0, state.obsT + delta));
    if (t === state.obsT) return;
    state.obsT = t;
    loadObservation();
  }

  function route() {
    const match = /^#\/episode\/(.+)$/.exec(location.hash);
    if (!match) return;
    let id;
    try {
      id = decodeURIComponent(match[1]);
    } catch (err) {
      return;
    }
    if (!state.current || state.current.episode_id !== id) openEpisode(id);
  }

  // ------------------------------------------------------------------ start

  async function start() {
    if (new URLSearchParams(location.search).has("token")) {
      history.replaceState(null, "", location.pathname + location.hash); // the cookie holds it now
    }
    $("filters").addEventListener("submit", (event) => {
      event.preventDefault();
      loadList();
    });
    $("refresh").addEventListener("click", () => loadList());
    $("episodes").tBodies[0].addEventListener("click", (event) => {
      const row = event.target.closest("tr[data-episode]");
      if (row && !event.target.closest("a")) location.hash = episodeHref(row.dataset.episode);
    });
    $("obs-prev").addEventListener("click", () => step(-1));
    $("obs-next").addEventListener("click", () => step(1));
    window.addEventListener("hashchange", route);
    try {
      state.hints = await getJSON("/hints");
      addKinds([...new Set(Object.keys(state.hints).map((key) => key.split("/")[1]))].sort());
    } catch (err) {
      reportFailure(err);
    }
    liveLoop();
    await loadList();
    route();
    document.body.dataset.ready = "1";
  }

  start();
})();
