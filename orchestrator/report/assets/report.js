// crosshost report.html: renders the flip matrix and the task view from the embedded JSON.
// Every string from the run is set with textContent, never parsed as markup.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("crosshost-data").textContent);
  var RUN = DATA.run;
  var HOSTS = DATA.hosts.map(function (h) { return h.name; });
  var REF = RUN.reference;
  var BY_ID = {};
  DATA.tasks.forEach(function (t) { BY_ID[t.task] = t; });

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (k === "class") node.className = attrs[k];
        else node.setAttribute(k, attrs[k]);
      });
    }
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function add(parent, child) { parent.appendChild(child); return child; }

  // --- the flip matrix ------------------------------------------------------------------------

  var matrix = document.getElementById("matrix");
  var rows = [];

  function buildMatrix() {
    var head = el("tr");
    add(head, el("th", null, "task"));
    HOSTS.forEach(function (h) {
      add(head, el("th", { "class": "host-col", "data-host": h }, h === REF ? h + " (ref)" : h));
    });
    add(head, el("th", null, "flip"));
    add(head, el("th", null, "classification"));
    add(head, el("th", null, "action"));
    add(head, el("th", null, "cause"));
    matrix.tHead.appendChild(head);
    var body = document.createDocumentFragment();
    DATA.tasks.forEach(function (t) {
      var tr = el("tr", { "class": "task-row" + (t.flip ? " flip" : ""), tabindex: "0" });
      tr.dataset.task = t.task;
      tr.dataset.classification = t.classification;
      var name = add(tr, el("td", { "class": "task-id" }));
      add(name, el("a", { href: "#task=" + encodeURIComponent(t.task) }, t.task));
      HOSTS.forEach(function (h) {
        var td = add(tr, el("td", { "class": "cell", "data-host": h }));
        var flipped = t.flipped_attempts[h] || [];
        (t.verdicts[h] || []).forEach(function (v, i) {
          var isFlip = flipped.indexOf(i) >= 0;
          var span = add(td, el("span", { "class": "v " + v + (isFlip ? " flipped" : ""), title: h + " attempt " + i + ": " + v + ((t.why[h] || [])[i] ? " — " + t.why[h][i] : "") }, v + (isFlip ? "*" : "")));
          span.dataset.attempt = String(i);
        });
      });
      add(tr, el("td", { "class": "flip-mark" }, t.flip ? "← flip" : ""));
      add(tr, el("td", { "class": "cls " + t.classification }, t.classification));
      add(tr, el("td", null, t.action));
      add(tr, el("td", { "class": "cause" }, t.cause || ""));
      tr.addEventListener("click", function (ev) {
        if (ev.target.tagName !== "A") location.hash = "task=" + encodeURIComponent(t.task);
      });
      tr.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter") location.hash = "task=" + encodeURIComponent(t.task);
      });
      rows.push({ tr: tr, task: t });
      body.appendChild(tr);
    });
    matrix.tBodies[0].appendChild(body);
  }

  function fillFilters() {
    var classes = {};
    DATA.tasks.forEach(function (t) { classes[t.classification] = (classes[t.classification] || 0) + 1; });
    var fc = document.getElementById("f-class");
    Object.keys(classes).sort().forEach(function (c) { add(fc, el("option", { value: c }, c + " (" + classes[c] + ")")); });
    var fh = document.getElementById("f-host");
    HOSTS.forEach(function (h) { add(fh, el("option", { value: h }, h === REF ? h + " (ref)" : h)); });
    ["f-class", "f-host", "f-flips"].forEach(function (id) { document.getElementById(id).addEventListener("change", applyFilters); });
    document.getElementById("f-search").addEventListener("input", applyFilters);
  }

  function applyFilters() {
    var cls = document.getElementById("f-class").value;
    var host = document.getElementById("f-host").value;
    var needle = document.getElementById("f-search").value.trim().toLowerCase();
    var flipsOnly = document.getElementById("f-flips").checked;
    var shown = 0;
    rows.forEach(function (r) {
      var t = r.task;
      var ok = (!cls || t.classification === cls) && (!needle || t.task.toLowerCase().indexOf(needle) >= 0);
      if (ok && flipsOnly) ok = host && host !== REF ? t.flipped_hosts.indexOf(host) >= 0 : t.flip;
      r.tr.hidden = !ok;
      if (ok) shown++;
    });
    // a host filter keeps the reference's column beside the chosen host's
    var cells = matrix.querySelectorAll("[data-host]");
    for (var i = 0; i < cells.length; i++) {
      var h = cells[i].getAttribute("data-host");
      cells[i].hidden = !!host && h !== host && h !== REF;
    }
    document.getElementById("f-count").textContent = shown + " of " + rows.length + " task(s)";
  }

  // --- the task view --------------------------------------------------------------------------

  // a step is embedded as [n, tool, args, args_fp, obs_fp, error, observation]
  function stepAt(trace, i) {
    if (i === null || i === undefined || !trace) return null;
    var a = trace.steps[i];
    return { n: a[0], tool: a[1], args: a[2], afp: a[3], ofp: a[4], err: a[5], obs: a[6] };
  }

  // aligned rows [ref index, host index, op]; traces of the same shapes come as {same: n, values: [...]}
  function pairRows(pair) {
    if (pair.rows) return pair.rows;
    var rows = [];
    for (var i = 0; i < pair.same; i++) rows.push([i, i, pair.values.indexOf(i) >= 0 ? "values" : "equal"]);
    return rows;
  }

  function rawLink(host, task, attempt) {
    return "hosts/" + encodeURIComponent(host) + "/traces/" + encodeURIComponent(task + "." + attempt + ".jsonl");
  }

  function json(value) {
    return typeof value === "string" ? JSON.stringify(value) : JSON.stringify(value);
  }

  function callNode(step, other) {
    var code = el("code", { "class": "call" });
    add(code, el("span", { "class": "tool" }, step.tool));
    code.appendChild(document.createTextNode("("));
    var keys = Object.keys(step.args || {}).sort();
    keys.forEach(function (k, i) {
      if (i) code.appendChild(document.createTextNode(", "));
      var differs = other && json((other.args || {})[k]) !== json(step.args[k]);
      var arg = add(code, el("span", { "class": "arg" + (differs ? " arg-differs" : "") }));
      add(arg, el("span", { "class": "key" }, k));
      arg.appendChild(document.createTextNode("="));
      add(arg, el("span", { "class": "val" }, json(step.args[k])));
    });
    code.appendChild(document.createTextNode(")"));
    return code;
  }

  function stepCells(tr, step, other) {
    if (!step) {
      add(tr, el("td", { "class": "n" }, ""));
      add(tr, el("td", { "class": "absent" }, "—"));
      return;
    }
    add(tr, el("td", { "class": "n" }, step.n));
    var td = add(tr, el("td", { "class": "step" }));
    td.appendChild(callNode(step, other));
    if (step.err) add(td, el("div", { "class": "err" }, "error: " + step.err));
    if (step.obs !== null && step.obs !== undefined) {
      var obs = add(td, el("pre", { "class": "obs" + (other && other.ofp && step.ofp && other.ofp !== step.ofp ? " obs-differs" : "") }, step.obs));
      obs.title = "observation (redacted)";
    } else if (step.ofp) {
      add(td, el("div", { "class": "obs-fp" }, "observation fp " + step.ofp));
    }
  }

  var OP_TEXT = { equal: "", values: "values differ", changed: "shape differs", missing: "missing on host", extra: "extra on host" };

  function finishBlock(label, trace, output) {
    var box = el("div", { "class": "finish" });
    add(box, el("div", { "class": "finish-head" }, label));
    if (!trace) { add(box, el("div", { "class": "absent" }, "no trace")); return box; }
    var f = trace.finish;
    if (!f) { add(box, el("div", { "class": "bad" }, "no finish record (the attempt was cut short)")); }
    else {
      var dl = add(box, el("dl"));
      [["verdict", f.verdict], ["predicate exit", f.predicate_exit], ["predicate / why", f.why], ["finish reason", f.reason], ["final message", f.final]].forEach(function (kv) {
        if (kv[1] === null || kv[1] === undefined || kv[1] === "") return;
        add(dl, el("dt", null, kv[0]));
        add(dl, el("dd", { "class": kv[0] === "verdict" ? "v " + kv[1] : "" }, kv[1]));
      });
    }
    if (output !== null && output !== undefined && output !== "") {
      add(box, el("div", { "class": "finish-head" }, "predicate output"));
      add(box, el("pre", { "class": "obs predicate-output" }, output));
    }
    trace.problems.forEach(function (p) { add(box, el("div", { "class": "bad" }, p)); });
    var links = add(box, el("div", { "class": "raw" }));
    add(links, el("a", { href: trace.path }, "raw trace"));
    if (trace.obs_path) { links.appendChild(document.createTextNode(" · ")); add(links, el("a", { href: trace.obs_path }, "observations")); }
    return box;
  }

  function sideBySide(t, host, attempt) {
    var wrap = el("div", { "class": "pair" });
    var ids = t.traces || {};
    var refId = (ids[REF] || [])[attempt], hostId = (ids[host] || [])[attempt];
    var ref = refId === null || refId === undefined ? null : DATA.traces[refId];
    var oth = hostId === null || hostId === undefined ? null : DATA.traces[hostId];
    var fins = add(wrap, el("div", { "class": "finishes" }));
    var outputs = t.predicate_output || {};
    fins.appendChild(finishBlock(REF + " (ref) attempt " + attempt, ref, (outputs[REF] || [])[attempt]));
    fins.appendChild(finishBlock(host + " attempt " + attempt, oth, (outputs[host] || [])[attempt]));
    var pair = (t.pairs[host] || [])[attempt];
    if (!pair) {
      if (t.embedded) {
        add(wrap, el("p", { "class": "absent" }, "no trace on one side: nothing to align"));
      } else {
        var p = add(wrap, el("p", { "class": "absent" }, "traces not embedded (the run is large): the raw traces are "));
        add(p, el("a", { href: rawLink(REF, t.task, attempt) }, REF));
        p.appendChild(document.createTextNode(" and "));
        add(p, el("a", { href: rawLink(host, t.task, attempt) }, host));
      }
      return wrap;
    }
    var rows = pairRows(pair);
    if (!rows.length) {
      add(wrap, el("p", { "class": "note" }, "no tool calls on either side: the verdicts come from the predicate alone (above)."));
      return wrap;
    }
    var note = "same tool-call shapes and argument values on both hosts";
    if (pair.first !== null) {
      var fr = rows[pair.first];
      var where = fr[1] !== null ? host + " step " + stepAt(oth, fr[1]).n : REF + " step " + stepAt(ref, fr[0]).n;
      note = "first divergence: " + where + " (" + OP_TEXT[fr[2]] + ")";
    }
    add(wrap, el("p", { "class": pair.first === null ? "note" : "note bad" }, note));
    var table = add(wrap, el("table", { "class": "sbs" }));
    var head = add(add(table, el("thead")), el("tr"));
    add(head, el("th", null, ""));
    add(head, el("th", null, "#"));
    add(head, el("th", null, REF + " (ref)"));
    add(head, el("th", null, "#"));
    add(head, el("th", null, host));
    var body = add(table, el("tbody"));
    rows.forEach(function (row, i) {
      var a = stepAt(ref, row[0]);
      var b = stepAt(oth, row[1]);
      var tr = add(body, el("tr", { "class": "op-" + row[2] + (i === pair.first ? " first-divergence" : "") }));
      tr.dataset.op = row[2];
      add(tr, el("td", { "class": "mark" }, i === pair.first ? "▶ first divergence" : OP_TEXT[row[2]]));
      stepCells(tr, a, b);
      stepCells(tr, b, a);
    });
    if ((ref && ref.more) || (oth && oth.more)) {
      add(wrap, el("p", { "class": "note" }, "only the first steps are shown and aligned; the raw traces hold the rest"));
    }
    return wrap;
  }

  function list(parent, title, items, fmt) {
    if (!items || !items.length) return;
    add(parent, el("h3", null, title));
    var ul = add(parent, el("ul"));
    items.forEach(function (x) { add(ul, el("li", null, fmt(x))); });
  }

  // crosshost explain's evidence: the same sentences as report.md, the reproducing ones marked
  function explainBlock(section, x) {
    var box = add(section, el("div", { "class": "explain", id: "explain" }));
    add(box, el("h3", null, "Explain: " + (x.again || "evidence of crosshost explain")));
    list(box, "Counterfactuals (one fact of the other host applied on " + REF + ")", x.counterfactuals, function (c) { return c.line; });
    var items = box.querySelectorAll("li");
    x.counterfactuals.forEach(function (c, i) { if (c.reproduces) items[i].className = "reproduces"; });
    list(box, "File evidence: touched paths whose state differs", x.paths, function (p) { return p.line; });
    list(box, "Not collected", x.not_collected, function (n) { return n; });
  }

  function showTask(id) {
    var section = document.getElementById("task");
    var t = BY_ID[id];
    rows.forEach(function (r) { r.tr.classList.toggle("selected", r.task.task === id); });
    section.textContent = "";
    if (!t) { hideTask(); return; }
    section.hidden = false;
    // the task is the page (the overview and the matrix step aside) and starts at its top: a link to
    // report.html#task=NAME, opened or screenshotted, shows the task without any scrolling
    document.body.classList.add("task-only");
    section.dataset.task = t.task;
    var h = add(section, el("h2"));
    h.textContent = t.task;
    add(section, el("p", { "class": "cls-line" }, t.classification + " — " + t.action + (t.flip ? " · flipped on " + t.flipped_hosts.join(", ") : "")));
    var close = add(section, el("a", { href: "#matrix-section", "class": "close" }, "back to the matrix"));
    close.addEventListener("click", function (ev) {
      ev.preventDefault();
      history.replaceState(null, "", "#matrix-section");
      hideTask();
      document.getElementById("matrix-section").scrollIntoView();
    });

    if (t.cause) add(section, el("p", { "class": "cause-line" }, "cause: " + t.cause));
    if (t.explain) explainBlock(section, t.explain);

    list(section, "Attribution: fingerprint fields that differ", t.attribution, function (a) {
      return a.reference + " vs " + a.host + ": " + (a.fields.length ? a.fields.map(function (f) {
        return f.field + " (" + (f.reference === null ? "unset" : f.reference) + " → " + (f.other === null ? "unset" : f.other) + ")";
      }).join(", ") : "no differing field");
    });
    if (t.statistics) {
      add(section, el("h3", null, "Pass rates (" + t.statistics.evidence + " evidence" + (t.statistics.needed_repeat ? "; --repeat " + t.statistics.needed_repeat + " could settle it" : "") + ")"));
      var st = add(section, el("table", { "class": "rates" }));
      var hr = add(add(st, el("thead")), el("tr"));
      ["host", "attempts", "passes", "pass rate", "95% interval", "p-value vs reference", "adjusted across the suite", "differs"].forEach(function (c) { add(hr, el("th", null, c)); });
      var sb = add(st, el("tbody"));
      t.statistics.rates.forEach(function (r) {
        var tr = add(sb, el("tr"));
        [r.host, r.n, r.passes, r.pass_rate === null ? "—" : r.pass_rate.toFixed(3),
         r.ci_low === null ? "—" : r.ci_low.toFixed(3) + " – " + r.ci_high.toFixed(3),
         r.p_value === null ? "—" : r.p_value.toPrecision(3),
         r.p_adjusted === null || r.p_adjusted === undefined ? "—" : r.p_adjusted.toPrecision(3), r.differs ? "yes" : ""].forEach(function (c) { add(tr, el("td", null, c)); });
      });
    }
    function leakLine(l) {
      return l.host + " attempt " + l.attempt + " step " + l.step + ": " + l.kind + (l.rule ? " [" + l.rule + "]" : "") + ": " + l.message + (l.evidence ? " (" + l.evidence + ")" : "");
    }
    list(section, "Leaks", t.leaks, leakLine);
    list(section, "Weak findings (not leaks: no cross-host evidence)", t.weak || [], leakLine);
    list(section, "Contract findings", t.findings, function (l) { return l.host + " attempt " + l.attempt + " step " + l.step + ": " + l.kind + ": " + l.message; });
    list(section, "Problems", t.problems, function (p) { return p; });
    list(section, "Model held", t.model_hold, function (p) { return p; });
    Object.keys(t.extra || {}).forEach(function (k) {
      add(section, el("h3", null, k));
      add(section, el("pre", { "class": "extra" }, JSON.stringify(t.extra[k], null, 2)));
    });

    HOSTS.forEach(function (host) {
      if (host === REF) return;
      var n = Math.max((t.verdicts[host] || []).length, (t.verdicts[REF] || []).length);
      if (!n) return;
      var block = add(section, el("div", { "class": "host-block" }));
      block.dataset.host = host;
      add(block, el("h3", null, REF + " (ref) vs " + host));
      var tabs = add(block, el("div", { "class": "tabs" }));
      var pane = add(block, el("div", { "class": "pane" }));
      var flipped = t.flipped_attempts[host] || [];
      var start = flipped.length ? flipped[0] : 0;
      var buttons = [];
      function pick(a) {
        buttons.forEach(function (b, i) { b.classList.toggle("active", i === a); });
        pane.textContent = "";
        pane.appendChild(sideBySide(t, host, a));
      }
      for (var a = 0; a < n; a++) {
        (function (a) {
          var v = (t.verdicts[host] || [])[a], rv = (t.verdicts[REF] || [])[a];
          var b = add(tabs, el("button", { type: "button", "class": flipped.indexOf(a) >= 0 ? "flipped" : "" }, "attempt " + a + ": " + rv + " → " + v));
          b.addEventListener("click", function () { pick(a); });
          buttons.push(b);
        })(a);
      }
      pick(start);
    });
    window.scrollTo(0, 0);
  }

  function hideTask() {
    var section = document.getElementById("task");
    section.hidden = true;
    section.textContent = "";
    document.body.classList.remove("task-only");
  }

  function route() {
    var m = /^#task=(.*)$/.exec(location.hash);
    if (m) showTask(decodeURIComponent(m[1]));
    else if (document.body.classList.contains("task-only")) hideTask();
  }

  buildMatrix();
  fillFilters();
  applyFilters();
  window.addEventListener("hashchange", route);
  route();
  document.body.dataset.ready = "1";
  window.crosshostReadyMs = performance.now();
})();
