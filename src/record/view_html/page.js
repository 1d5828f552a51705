"use strict";
// Draws the run held in #subloop-run. Every text from the trace is set with
// textContent (never parsed as HTML). When done, the root element gets
// data-ready="1" and the counts drawn; an error is data-error. A long lane
// draws only its ends: the calls between are folded, and drawn from the data
// a chunk at a time when asked for (a click, or a link to one of them).
(function () {
  const root = document.documentElement;
  const DECISIONS = {
    allowed: "ran after the gate allowed it",
    not_required: "ran: read-only, no approval needed",
    denied: "not executed: the gate denied it",
    blocked: "not executed: a before hook blocked it",
    over_limit: "not executed: over the per-reply tool limit",
    invalid: "not executed: arguments failed the schema check",
    unregistered: "not executed: no such tool offered",
    stopped: "not executed: the run stopped first",
  };
  const NOTES = {
    request: "The request carries the whole history so far; the plan rides along as a system attachment and is never stored in the history.",
    reply: "The reply is stored in the history before any tool runs.",
    results: "Every tool_use is answered exactly once, in call order, in the next user message, under the id of its call.",
    denied: "A refused call goes back to the model as \u201cnot executed\u201d: it never ran.",
    task: "task hands a sub-question to a child with a fresh history; only the bounded report {status, summary, calls} comes back.",
    child: "A child starts from [user: task] alone, with the host's tool whitelist and a call budget of its own.",
    end: "A reply without tool calls ends the loop, with a stated status.",
    budget: "Each agent has its own call budget; reaching it ends the agent with call_limit.",
  };
  const FOLD_AT = 8; // a run of this many similar calls is folded
  const EDGE = 20; // a long lane draws its first and last EDGE calls ...
  const LONG = 2 * EDGE + 10; // ... when it has more calls than this
  const CHUNK = 100; // a fold draws this many calls per click; the rest stay folded
  const PREVIEW = 160;

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function preview(text, n) {
    const s = String(text === undefined || text === null ? "" : text);
    const limit = n || PREVIEW;
    return s.length > limit ? s.slice(0, limit) + "\u2026" : s;
  }
  function note(kind) {
    return el("div", "note", NOTES[kind]);
  }
  function decisionClass(decision) {
    return Object.prototype.hasOwnProperty.call(DECISIONS, decision) ? "d-" + decision : "d-other";
  }

  // The tools whose calls start a child: `task`, or another agent's own.
  let delegating = new Set(["task"]);
  function delegates(name) { return delegating.has(name); }

  const started = performance.now();
  let data;
  try {
    const holder = document.getElementById("subloop-run");
    data = JSON.parse(holder ? holder.textContent : "null");
    main(data);
  } catch (err) {
    root.dataset.error = String((err && err.message) || err);
    console.error("subloop view:", err);
    const box = el("pre", "fatal", "This page could not be drawn: " + root.dataset.error);
    document.body.appendChild(box);
  }

  function main(run) {
    if (!run || !Array.isArray(run.lanes)) throw new Error("no run data in the page");
    if (Array.isArray(run.delegating)) delegating = new Set(run.delegating.map(String));
    const laneIndex = new Map(); // agent name -> lane index
    run.lanes.forEach(function (lane, i) { laneIndex.set(String(lane.agent), i); });
    const useById = new Map(); // "lane|call|id" -> element, for breach links
    const useOfTask = new Map(); // "call|task id" -> the parent's use element
    const resultOfTask = new Map(); // "call|task id" -> the parent's result element
    const taskKey = function (call, id) { return call + "|" + id; };

    // Header.
    const header = el("header", "top");
    header.appendChild(el("h1", null, "subloop run \u2014 " + (run.title || "trace")));
    if (run.question) {
      const q = el("p", "question");
      q.appendChild(el("b", null, "question: "));
      q.appendChild(document.createTextNode(preview(run.question, 600)));
      header.appendChild(q);
    }
    const outcome = el("p", "outcome");
    if (run.outcome) {
      outcome.appendChild(el("span", "status s-" + (run.outcome.status === "answered" ? "ok" : "bad"), run.outcome.status));
      outcome.appendChild(document.createTextNode(" " + preview(run.outcome.text, 600)));
    } else {
      outcome.appendChild(el("span", "status s-bad", "no outcome"));
      outcome.appendChild(document.createTextNode(" the trace ends before the run finished"));
    }
    header.appendChild(outcome);
    const c = run.counts || {};
    header.appendChild(el("p", "counts", (c.lanes || 0) + " agent(s), " + (c.calls || 0) + " model call(s), " + (c.links || 0) + " tool call(s) with a result"));
    const controls = el("div", "controls");
    const toggle = el("label", "toggle");
    const box = el("input");
    box.type = "checkbox";
    box.id = "notes-toggle";
    box.addEventListener("change", function () {
      document.body.classList.toggle("notes", box.checked);
      align();
    });
    toggle.appendChild(box);
    toggle.appendChild(document.createTextNode(" teaching notes"));
    controls.appendChild(toggle);
    const legend = el("ul", "legend");
    Object.keys(DECISIONS).forEach(function (d) {
      const item = el("li", decisionClass(d));
      item.appendChild(el("span", "swatch"));
      item.appendChild(el("b", null, d));
      item.appendChild(document.createTextNode(" " + DECISIONS[d]));
      legend.appendChild(item);
    });
    controls.appendChild(legend);
    header.appendChild(controls);
    document.body.appendChild(header);

    const layout = el("div", "layout");
    const lanes = el("div", "lanes");
    const side = el("aside", "side");
    layout.appendChild(lanes);
    layout.appendChild(side);
    document.body.appendChild(layout);

    // The inspector: a box's full JSON.
    const inspector = el("section", "inspector");
    const inspectTitle = el("h2", null, "details");
    const inspectBody = el("pre", "json", "Click a call's header for its full request, its reply for the reply, a result for its tool line.");
    inspector.appendChild(inspectTitle);
    inspector.appendChild(inspectBody);
    function inspect(title, value) {
      inspectTitle.textContent = title;
      inspectBody.textContent = JSON.stringify(value, null, 2);
      inspector.classList.add("shown");
    }

    function jump(target) {
      if (!target) return;
      target.scrollIntoView({ block: "center", inline: "center" });
      target.classList.remove("flash");
      void target.offsetWidth;
      target.classList.add("flash");
    }
    function linkTo(node, target) {
      node.addEventListener("click", function (event) {
        event.preventDefault();
        event.stopPropagation();
        jump(typeof target === "function" ? target() : target);
      });
    }

    run.lanes.forEach(function (lane, li) {
      lanes.appendChild(drawLane(lane, li));
    });

    function signature(call) {
      if (call.failure || !Array.isArray(call.uses) || call.uses.length === 0) return null;
      const parts = [call.stop];
      for (const use of call.uses) {
        if (delegates(use.name)) return null;
        const result = use.result === null || use.result === undefined ? null : call.results[use.result];
        parts.push(use.name + ":" + (result ? result.decision : "none"));
      }
      return parts.join(" ");
    }

    function drawLane(lane, li) {
      const section = el("section", "lane");
      section.id = "lane-" + li;
      section.dataset.lane = String(lane.agent);
      const head = el("div", "lane-head");
      head.appendChild(el("h2", null, lane.agent));
      if (lane.started_by) {
        const from = el("a", "back", "started by task " + lane.started_by);
        from.href = "#";
        linkTo(from, function () { return useOfTask.get(taskKey(lane.started_in, lane.started_by)); });
        head.appendChild(from);
        head.appendChild(note("child"));
      }
      const calls = Array.isArray(lane.calls) ? lane.calls : [];
      const meter = el("div", "budget");
      if (typeof lane.budget === "number") {
        // The parent's budget is per question: the most one question used.
        const used = lane.questions > 1 ? lane.most_in_a_question : calls.length;
        const m = el("meter");
        m.min = 0;
        m.max = lane.budget;
        m.value = Math.min(used, lane.budget);
        meter.appendChild(m);
        meter.appendChild(document.createTextNode(lane.questions > 1
          ? " " + calls.length + " calls over " + lane.questions + " questions; at most " + used + " of " + lane.budget + " in one"
          : " " + used + " of " + lane.budget + " calls"));
        if (used > lane.budget) meter.classList.add("over");
      } else {
        meter.appendChild(document.createTextNode(calls.length + " call(s); budget not given (view --max-calls / --child-calls)"));
      }
      head.appendChild(meter);
      head.appendChild(note("budget"));
      section.appendChild(head);

      // A long lane: its first and last calls, the rest folded. Within
      // what is drawn, the middle of a run of similar calls is folded too.
      const drawRange = function (from, to) {
        let i = from;
        while (i < to) {
          const sig = signature(calls[i]);
          let j = i + 1;
          while (sig !== null && j < to && signature(calls[j]) === sig) j++;
          if (sig !== null && j - i >= FOLD_AT) {
            const keepHead = 3, keepTail = 2;
            for (let k = i; k < i + keepHead; k++) section.appendChild(drawCall(lane, li, calls[k]));
            section.appendChild(fold(lane, li, i + keepHead, j - keepTail, sig));
            for (let k = j - keepTail; k < j; k++) section.appendChild(drawCall(lane, li, calls[k]));
            i = j;
          } else {
            section.appendChild(drawCall(lane, li, calls[i]));
            i++;
          }
        }
      };
      if (calls.length > LONG) {
        drawRange(0, EDGE);
        section.appendChild(fold(lane, li, EDGE, calls.length - EDGE, null));
        drawRange(calls.length - EDGE, calls.length);
      } else {
        drawRange(0, calls.length);
      }

      // How the agent ended.
      const end = el("div", "end");
      if (lane.agent === "parent") {
        if (run.outcome) {
          end.appendChild(el("span", "status s-" + (run.outcome.status === "answered" ? "ok" : "bad"), run.outcome.status));
          end.appendChild(document.createTextNode(" " + preview(run.outcome.text)));
        } else {
          end.appendChild(el("span", "status s-bad", "no outcome recorded"));
        }
        end.appendChild(note("end"));
      } else if (lane.report && typeof lane.report === "object") {
        end.appendChild(el("b", null, "report to the parent: "));
        end.appendChild(el("span", "status s-" + (lane.report.status === "answered" ? "ok" : "bad"), lane.report.status));
        const summary = String(lane.report.summary === undefined ? "" : lane.report.summary);
        end.appendChild(document.createTextNode(" " + preview(summary) + " (" + lane.report.calls + " calls)"));
        if (summary.indexOf("(summary too long, truncated") !== -1) {
          end.appendChild(el("span", "truncated", "summary truncated"));
        }
        const back = el("a", "back", "\u21a9 the parent's result");
        back.href = "#";
        linkTo(back, function () {
          if (laneIndex.has("parent")) reveal(laneIndex.get("parent"), lane.started_in);
          return resultOfTask.get(taskKey(lane.started_in, lane.started_by));
        });
        end.appendChild(back);
        end.dataset.report = "1";
      } else if (lane.report !== null && lane.report !== undefined) {
        end.appendChild(document.createTextNode("report to the parent: " + preview(lane.report)));
      } else {
        end.appendChild(el("span", "status s-bad", "no report on record"));
        end.appendChild(document.createTextNode(" (the parent's task result was not recorded)"));
      }
      section.appendChild(end);
      return section;
    }

    // The calls lane.calls[from..to) not drawn: a button that draws them
    // from the data, CHUNK at a time, where it stands. What it holds is
    // counted on it (data-folded-*), so the page's counts stay whole.
    function fold(lane, li, from, to, sig) {
      const calls = lane.calls;
      const count = to - from;
      const button = el("button", "fold");
      button.type = "button";
      button.dataset.from = String(from);
      button.dataset.to = String(to);
      let links = 0, asked = 0;
      for (let k = from; k < to; k++) {
        const call = calls[k];
        if (Array.isArray(call.uses)) {
          call.uses.forEach(function (use) { if (use.result !== null && use.result !== undefined) links++; });
        }
        if (Array.isArray(call.asked)) asked += call.asked.length;
      }
      button.dataset.foldedCalls = String(count);
      button.dataset.foldedLinks = String(links);
      button.dataset.foldedAsked = String(asked);
      const first = calls[from].call, last = calls[to - 1].call;
      button.dataset.first = String(first);
      const what = sig !== null
        ? count + " similar calls (" + sig + ")"
        : count + " calls (#" + first + "\u2013#" + last + ") not drawn";
      button.textContent = "\u25b8 " + what + " \u2014 " + (count > CHUNK ? "show " + CHUNK : "show");
      // Draws the chunk holding lane.calls[at]; what is left stays folded.
      button.openAt = function (at) {
        const start = at - from < CHUNK ? from : Math.max(from, Math.min(at - Math.floor(CHUNK / 2), to - CHUNK));
        const end = Math.min(to, start + CHUNK);
        const drawn = document.createDocumentFragment();
        if (start > from) drawn.appendChild(fold(lane, li, from, start, sig));
        for (let k = start; k < end; k++) drawn.appendChild(drawCall(lane, li, calls[k]));
        if (end < to) drawn.appendChild(fold(lane, li, end, to, sig));
        button.replaceWith(drawn);
        align();
      };
      button.addEventListener("click", function () { button.openAt(from); });
      return button;
    }

    // Draws call number `number` of lane `li` if a fold holds it.
    function reveal(li, number) {
      if (document.getElementById("c-" + li + "-" + number)) return;
      const held = foldHolding(li, number);
      if (held) held.button.openAt(held.at);
    }
    function foldHolding(li, number) {
      const lane = run.lanes[li];
      const section = document.getElementById("lane-" + li);
      if (!lane || !section) return null;
      const folds = section.querySelectorAll("button.fold");
      for (const button of folds) {
        const from = Number(button.dataset.from), to = Number(button.dataset.to);
        for (let k = from; k < to; k++) {
          if (lane.calls[k].call === number) return { button: button, at: k };
        }
      }
      return null;
    }

    function drawCall(lane, li, call) {
      const box = el("article", "call");
      box.id = "c-" + li + "-" + call.call;
      box.dataset.call = String(call.call);
      (Array.isArray(call.asked) ? call.asked : []).forEach(function (question) {
        const asked = el("div", "asked");
        asked.dataset.asked = "1";
        asked.appendChild(el("b", null, "follow-up question: "));
        asked.appendChild(document.createTextNode(preview(question, 600)));
        box.appendChild(asked);
      });
      (Array.isArray(call.compacted) ? call.compacted : []).forEach(function (c) {
        const compacted = el("div", "compacted");
        compacted.dataset.compacted = "1";
        compacted.appendChild(el("b", null, "history compacted (" + c.trigger + ", " + c.compactor + "): "));
        const about = typeof c.tokens === "number" ? " (about " + c.tokens + " tokens)" : "";
        compacted.appendChild(document.createTextNode(c.replaced + " messages" + about + " \u2192 " + c.kept + " messages"));
        box.appendChild(compacted);
      });
      const head = el("button", "head");
      head.type = "button";
      const parts = ["#" + call.call];
      if (call.failure) parts.push("model call failed");
      else if (call.reply) parts.push(call.stop || "no stop reason");
      else parts.push("no reply on record");
      if (Array.isArray(call.tokens)) parts.push(call.tokens[0] + " in / " + call.tokens[1] + " out tokens");
      const offered = Array.isArray(call.offered) ? call.offered : [];
      parts.push(offered.length + " tools offered");
      head.textContent = parts.join(" \u00b7 ");
      head.title = "offered: " + offered.join(", ") + " \u2014 click for the full request";
      head.addEventListener("click", function () {
        const histories = Array.isArray(lane.histories) ? lane.histories : [lane.history];
        const base = histories[call.history || 0];
        const messages = Array.isArray(call.own_messages)
          ? call.own_messages
          : (Array.isArray(base) ? base.slice(0, call.messages || 0) : []);
        const tools = Array.isArray(call.own_tools) ? call.own_tools : lane.tools;
        const request = { system: lane.system, tools: tools, messages: messages };
        if (call.plan) request.attachment = call.plan;
        inspect(lane.agent + " request " + call.call + " (" + messages.length + " messages)", request);
      });
      box.appendChild(head);
      box.appendChild(note("request"));
      if (call.plan && lane.agent === "parent") {
        box.appendChild(el("div", "plan", preview(call.plan, 400)));
      }
      if (call.failure) {
        box.appendChild(el("div", "failure", preview(call.failure, 400)));
      } else if (call.reply) {
        const reply = el("div", "reply");
        reply.textContent = call.text ? preview(call.text, 400) : (call.uses.length ? "" : "(no text)");
        reply.title = "click for the reply";
        reply.addEventListener("click", function () { inspect(lane.agent + " reply " + call.call, call.reply); });
        if (reply.textContent) box.appendChild(reply);
        else {
          const r = el("button", "reply-json", "reply JSON");
          r.type = "button";
          r.addEventListener("click", function () { inspect(lane.agent + " reply " + call.call, call.reply); });
          box.appendChild(r);
        }
        box.appendChild(note("reply"));
        if (call.stop === "end_turn") box.appendChild(note("end"));
        if (typeof call.sent_back === "string") {
          const back = el("div", "asked");
          back.appendChild(el("b", null, "does not match the output schema, sent back: "));
          back.appendChild(document.createTextNode(preview(call.sent_back, 600)));
          box.appendChild(back);
        }
      }
      const results = Array.isArray(call.results) ? call.results : [];
      const resultNodes = results.map(function (line, k) {
        const node = el("div", "result " + decisionClass(line.decision));
        node.id = "r-" + li + "-" + call.call + "-" + k;
        const top = el("div", "result-head");
        top.appendChild(el("span", "badge", line.decision));
        top.appendChild(document.createTextNode(" " + line.name + " " + line.id + (line.is_error ? " \u00b7 is_error" : "")));
        node.appendChild(top);
        node.appendChild(el("div", "content", preview(line.content)));
        node.title = "click for the tool line";
        node.addEventListener("click", function () { inspect(lane.agent + " result " + line.id, line); });
        if (line.decision !== "allowed" && line.decision !== "not_required") node.appendChild(note("denied"));
        const rkey = taskKey(call.call, line.id);
        if (lane.agent === "parent" && delegates(line.name) && !resultOfTask.has(rkey)) resultOfTask.set(rkey, node);
        return node;
      });
      if (Array.isArray(call.uses) && call.uses.length) {
        const uses = el("div", "uses");
        call.uses.forEach(function (use, k) {
          const node = el("div", "use");
          node.id = "u-" + li + "-" + call.call + "-" + k;
          const key = li + "|" + call.call + "|" + use.id;
          if (!useById.has(key)) useById.set(key, node);
          const ukey = taskKey(call.call, use.id);
          if (lane.agent === "parent" && delegates(use.name) && !useOfTask.has(ukey)) useOfTask.set(ukey, node);
          node.appendChild(el("span", "name", use.name));
          node.appendChild(el("span", "id", " " + use.id + " "));
          const target = use.result === null || use.result === undefined ? null : resultNodes[use.result];
          if (target) {
            const line = results[use.result];
            const a = el("a", "link " + decisionClass(line.decision), "\u2192 " + line.decision);
            a.href = "#" + target.id;
            a.dataset.link = use.id;
            linkTo(a, target);
            node.appendChild(a);
            const back = el("a", "back", "\u2191 tool_use");
            back.href = "#" + node.id;
            linkTo(back, node);
            target.querySelector(".result-head").appendChild(back);
          } else {
            node.appendChild(el("span", "link missing", "no result on record"));
          }
          if (use.child !== null && use.child !== undefined && laneIndex.has(use.child)) {
            const d = el("a", "delegate", "\u21e2 " + use.child);
            d.href = "#lane-" + laneIndex.get(use.child);
            d.dataset.delegation = use.child;
            linkTo(d, function () { return document.getElementById("lane-" + laneIndex.get(use.child)); });
            node.appendChild(d);
          }
          const args = el("div", "args", preview(JSON.stringify(use.input)));
          node.appendChild(args);
          if (delegates(use.name)) node.appendChild(note("task"));
          uses.appendChild(node);
        });
        box.appendChild(uses);
      }
      if (resultNodes.length) {
        const message = el("div", "results");
        message.appendChild(el("div", "label", "user: tool_result \u00d7 " + resultNodes.length));
        resultNodes.forEach(function (node) { message.appendChild(node); });
        message.appendChild(note("results"));
        box.appendChild(message);
      }
      return box;
    }

    // The invariants panel.
    const panel = el("section", "invariants");
    panel.appendChild(el("h2", null, "invariants"));
    const list = el("ul");
    (Array.isArray(run.verdicts) ? run.verdicts : []).forEach(function (verdict) {
      const item = el("li", verdict.held ? "held" : "broken");
      item.dataset.invariant = String(verdict.invariant);
      item.appendChild(el("span", "mark", verdict.held ? "held" : "broken"));
      item.appendChild(document.createTextNode(" " + verdict.rule));
      if (!verdict.held) {
        const where = el("ul", "breaches");
        verdict.breaches.forEach(function (breach) {
          const b = el("li");
          const label = breach.agent + (breach.call ? " call " + breach.call : "") + (breach.id ? " " + breach.id : "");
          const a = el("a", "breach", label);
          a.href = "#";
          linkTo(a, function () {
            const lane = laneIndex.get(String(breach.agent));
            if (lane === undefined) return null;
            if (breach.call) reveal(lane, breach.call);
            if (breach.call && breach.id) {
              const use = useById.get(lane + "|" + breach.call + "|" + breach.id);
              if (use) return use;
            }
            if (breach.call) return document.getElementById("c-" + lane + "-" + breach.call);
            return document.getElementById("lane-" + lane);
          });
          b.appendChild(a);
          b.appendChild(document.createTextNode(": " + breach.detail));
          where.appendChild(b);
        });
        item.appendChild(where);
      }
      list.appendChild(item);
    });
    panel.appendChild(list);
    side.appendChild(panel);
    side.appendChild(inspector);

    // A child's lane starts level with the task call that started it.
    function align() {
      const base = lanes.getBoundingClientRect().top;
      run.lanes.forEach(function (lane, li) {
        if (!lane.started_by) return;
        const section = document.getElementById("lane-" + li);
        const parent = laneIndex.get("parent");
        const held = useOfTask.has(taskKey(lane.started_in, lane.started_by)) || parent === undefined
          ? null : foldHolding(parent, lane.started_in);
        const use = useOfTask.get(taskKey(lane.started_in, lane.started_by)) || (held && held.button);
        if (!section || !use) return;
        section.style.marginTop = "0px";
        const offset = use.getBoundingClientRect().top - base;
        section.style.marginTop = Math.max(0, Math.round(offset)) + "px";
      });
    }
    align();
    window.addEventListener("resize", align);

    // Counts: what is drawn and what the folds hold.
    const held = function (key) {
      let total = 0;
      document.querySelectorAll("button.fold").forEach(function (button) { total += Number(button.dataset[key]) || 0; });
      return total;
    };
    root.dataset.lanes = String(document.querySelectorAll("[data-lane]").length);
    root.dataset.drawnCalls = String(document.querySelectorAll("[data-call]").length);
    root.dataset.calls = String(document.querySelectorAll("[data-call]").length + held("foldedCalls"));
    root.dataset.links = String(document.querySelectorAll("[data-link]").length + held("foldedLinks"));
    root.dataset.delegations = String(document.querySelectorAll("[data-delegation]").length);
    root.dataset.asked = String(document.querySelectorAll("[data-asked]").length + held("foldedAsked"));
    root.dataset.elements = String(document.getElementsByTagName("*").length);
    root.dataset.broken = String(document.querySelectorAll(".invariants li.broken").length);
    // Anything this page fetched would be listed here (it fetches nothing).
    root.dataset.resources = String(performance.getEntriesByType("resource").length);
    root.dataset.drawMs = String(Math.round(performance.now() - started));
    root.dataset.ready = "1";
    // `page.html#selftest` drives the page's own controls once and says
    // in data-selftest whether each did its job (the browser test uses it).
    if (location.hash === "#selftest") root.dataset.selftest = selftest();
  }

  function selftest() {
    const problems = [];
    const inspected = function (what, test) {
      const body = document.querySelector(".inspector .json");
      let value = null;
      try { value = JSON.parse(body.textContent); } catch (err) { problems.push(what + ": not JSON"); return; }
      if (!test(value)) problems.push(what + ": wrong JSON");
    };
    const head = document.querySelector(".call .head");
    if (head) {
      head.click();
      inspected("request", function (v) { return Array.isArray(v.messages) && v.messages.length > 0 && "system" in v; });
    } else problems.push("no call box");
    const result = document.querySelector(".result");
    if (result) {
      result.click();
      inspected("result", function (v) { return typeof v.decision === "string" && "content" in v; });
    }
    const link = document.querySelector("[data-link]");
    if (link) {
      link.click();
      const target = document.getElementById(link.getAttribute("href").slice(1));
      if (!target || !target.classList.contains("flash")) problems.push("link: its result is not shown");
    }
    const toggle = document.getElementById("notes-toggle");
    toggle.click();
    const shown = Array.prototype.some.call(document.querySelectorAll(".note"), function (n) { return n.offsetParent !== null; });
    if (!document.body.classList.contains("notes") || !shown) problems.push("teaching notes do not show");
    toggle.click();
    // A fold draws its first calls where it stood, and the counts stay whole.
    const fold = document.querySelector("button.fold");
    if (fold) {
      const lane = fold.closest("[data-lane]");
      const callsBefore = document.querySelectorAll("[data-call]").length;
      const heldBefore = Number(fold.dataset.foldedCalls);
      const shownCalls = function () {
        let total = document.querySelectorAll("[data-call]").length;
        document.querySelectorAll("button.fold").forEach(function (b) { total += Number(b.dataset.foldedCalls); });
        return total;
      };
      const whole = shownCalls();
      const first = Number(fold.dataset.first);
      fold.click();
      const box = lane && lane.querySelectorAll("[data-call]");
      const drawn = document.querySelectorAll("[data-call]").length - callsBefore;
      if (fold.isConnected) problems.push("fold does not open");
      else if (drawn < 1 || drawn > Math.min(heldBefore, CHUNK)) problems.push("fold drew " + drawn + " calls");
      else if (shownCalls() !== whole) problems.push("fold: calls lost or doubled");
      else if (!box || !Array.prototype.some.call(box, function (b) { return Number(b.dataset.call) === first; })) problems.push("fold: its first call is not drawn");
    }
    // A breach link shows its call, drawing it first if a fold held it.
    const breach = document.querySelector(".breach");
    if (breach) {
      document.querySelectorAll(".flash").forEach(function (node) { node.classList.remove("flash"); });
      breach.click();
      const shown = document.querySelector(".flash");
      const call = / call (\d+)/.exec(breach.textContent);
      if (!shown) problems.push("breach link: nothing shown");
      else if (call && !(shown.closest("[data-call]") && shown.closest("[data-call]").dataset.call === call[1])) problems.push("breach link: another call shown");
    }
    return problems.length ? problems.join("; ") : "ok";
  }
})();
