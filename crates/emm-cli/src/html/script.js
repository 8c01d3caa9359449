// emm replay's page: hover details and zoom over the charts, hover details over
// the segment maps. Reads the data the page carries (#emm-data); fetches nothing.
// With #selftest in the address it works its own controls and writes what it saw
// into a hidden element with the id "selftest" (the browser test reads it).
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("emm-data").textContent);
  var tip = document.getElementById("tip");
  var UNITS = ["KiB", "MiB", "GiB", "TiB", "PiB"];

  function bytes(b) {
    if (b < 1024) return b + " B";
    var v = b / 1024, u = 0;
    while (v >= 1024 && u + 1 < UNITS.length) { v /= 1024; u++; }
    return v.toFixed(v < 9.995 ? 2 : v < 99.95 ? 1 : 0) + " " + UNITS[u];
  }
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function show(html, ev) {
    tip.innerHTML = html;
    tip.hidden = false;
    var x = ev.pageX + 14, y = ev.pageY + 14;
    var maxX = window.scrollX + document.documentElement.clientWidth - tip.offsetWidth - 8;
    tip.style.left = Math.max(0, Math.min(x, maxX)) + "px";
    tip.style.top = y + "px";
  }
  function hide() { tip.hidden = true; }
  function step(range, n) {
    var raw = Math.max(range / n, 1e-12), p = Math.pow(10, Math.floor(Math.log10(raw)));
    var s = [1, 2, 5, 10].map(function (m) { return m * p; }).find(function (s) { return s >= raw; });
    return s || 10 * p;
  }
  function label(v, s) {
    return v.toFixed(Math.min(9, Math.max(0, -Math.floor(Math.log10(s)))));
  }
  function swatch(c) { return '<i style="background:' + c + '"></i>'; }

  // Charts.
  var charts = data.charts.map(function (ch) {
    var svg = document.getElementById("chart" + ch.id);
    var zoom = svg.querySelector(".zoom"), cursor = svg.querySelector(".cursor");
    var sel = svg.querySelector(".select"), hover = svg.querySelector(".hover");
    var ticks = svg.querySelector(".xticks"), NS = "http://www.w3.org/2000/svg";
    var view = [0, ch.xmax], drag = null;
    function apply() {
      var k = ch.pw / ((view[1] - view[0]) / ch.xmax * ch.vx);
      var tx = ch.left - view[0] / ch.xmax * ch.vx * k;
      zoom.setAttribute("transform", "translate(" + tx + " 0) scale(" + k + " 1)");
      while (ticks.firstChild) ticks.removeChild(ticks.firstChild);
      var s = step(view[1] - view[0], 6);
      for (var v = Math.ceil(view[0] / s) * s; v <= view[1] + s * 1e-6; v += s) {
        var t = document.createElementNS(NS, "text");
        t.setAttribute("x", px(v).toFixed(1));
        t.setAttribute("y", (ch.top + ch.ph + 18).toFixed(1));
        t.setAttribute("text-anchor", "middle");
        t.textContent = label(v, s);
        ticks.appendChild(t);
      }
      svg.setAttribute("data-view", view[0] + " " + view[1]);
    }
    function px(x) { return ch.left + (x - view[0]) / (view[1] - view[0]) * ch.pw; }
    function toX(clientX) {
      var r = svg.getBoundingClientRect();
      var p = (clientX - r.left) * svg.viewBox.baseVal.width / r.width;
      return view[0] + (p - ch.left) / ch.pw * (view[1] - view[0]);
    }
    function set(a, b) {
      var min = ch.xmax / 1e4;
      if (b - a < min) { var c = (a + b) / 2; a = c - min / 2; b = c + min / 2; }
      view = [Math.max(0, a), Math.min(ch.xmax, b)];
      apply();
    }
    function bucket(x) {
      var lo = 1, hi = ch.x.length - 1;
      while (lo < hi) { var m = (lo + hi) >> 1; if (ch.x[m] < x) lo = m + 1; else hi = m; }
      return lo;
    }
    function where(x, width) {
      var d = Math.min(6, Math.max(3, Math.ceil(-Math.log10(width || 1)) + 1));
      return ch.time ? x.toFixed(d) + " s" : "event " + Math.round(x);
    }
    function figures(x) {
      var j = bucket(x), a = ch.x[j - 1] || 0, b = ch.x[j] || 0;
      var h = "<b>" + esc(where(a, b - a)) + " to " + esc(where(b, b - a)) + "</b>";
      if (ch.passes > 1 && ch.span > 0) h += " (pass " + (Math.floor(x / ch.span) + 1) + ")";
      ch.series.forEach(function (s, i) {
        var y = s.y[j];
        if (y === null || y === undefined) return;
        h += "<br>" + swatch(s.color) + esc(s.name) + (i ? " reserved" : "") + ": " + bytes(y) +
          (s.failed ? ' <span class="failed">FAILED</span>' : "");
      });
      var r = ch.recorded;
      if (r && x <= r.end) {
        var p = -1;
        for (var k = 0; k < r.x.length && r.x[k] <= x; k++) p = k;
        if (p >= 0) h += "<br>" + swatch("#ff7f0e") + "PyTorch reserved (recorded): " + bytes(r.y[p]);
      }
      return h + '<br><span class="note">the most in this span</span>';
    }
    function move(ev) {
      var x = Math.max(view[0], Math.min(view[1], toX(ev.clientX)));
      cursor.setAttribute("x1", px(x)); cursor.setAttribute("x2", px(x));
      cursor.setAttribute("visibility", "visible");
      if (drag !== null) {
        var a = px(Math.min(drag, x)), b = px(Math.max(drag, x));
        sel.setAttribute("x", a); sel.setAttribute("width", b - a);
        sel.setAttribute("visibility", "visible");
      }
      show(figures(x), ev);
    }
    hover.addEventListener("mousemove", move);
    hover.addEventListener("mouseleave", function () {
      cursor.setAttribute("visibility", "hidden"); hide();
    });
    hover.addEventListener("mousedown", function (ev) { ev.preventDefault(); drag = toX(ev.clientX); });
    hover.addEventListener("mouseup", function (ev) {
      if (drag === null) return;
      var x = toX(ev.clientX), a = Math.min(drag, x), b = Math.max(drag, x);
      drag = null;
      sel.setAttribute("visibility", "hidden");
      if ((b - a) / (view[1] - view[0]) * ch.pw > 4) set(a, b);
    });
    hover.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var x = toX(ev.clientX), f = ev.deltaY < 0 ? 0.8 : 1.25;
      set(x - (x - view[0]) * f, x + (view[1] - x) * f);
    }, { passive: false });
    hover.addEventListener("dblclick", function () { set(0, ch.xmax); });
    var reset = document.querySelector('button.reset[data-chart="' + ch.id + '"]');
    if (reset) reset.addEventListener("click", function () { set(0, ch.xmax); });
    apply();
    return { ch: ch, svg: svg, hover: hover, view: function () { return view; } };
  });

  // Segment maps.
  var KINDS = {
    live: "live: one of the trace's allocations",
    cached: "cached: free, held in a thread's cache of freed blocks",
    free: "free: could go back to the device",
    stranded: "stranded: free, but beside live blocks (its segment, or its 2 MiB page)",
    held: "held by the manager besides its live allocations (the default manager: frees waiting in its queue)"
  };
  function frames(id) {
    if (id === null || id === undefined) return "";
    var st = data.stacks.stacks[id];
    if (!st) return "";
    return '<div class="frames">' + st.map(function (f) { return esc(data.stacks.frames[f]); }).join("\n") + "</div>";
  }
  function segment(m, g) {
    if (g === null || g === undefined || !m.segments[g]) return "";
    var s = m.segments[g];
    return '<br><span class="note">in segment ' + (g + 1) + " of " + m.segments.length + ": " + bytes(s[1]) +
      (s[2] ? ", large" : ", small") + (s[3] ? ", expandable" : "") + ", at " + s[0] + ", " + s[4] + " live blocks</span>";
  }
  function block(m, e) {
    var h;
    if (e.k === "live") {
      h = "<b>live block " + bytes(e.s) + "</b> (" + bytes(e.r) + " requested)<br>stream " + esc(e.st) +
        ", made " + esc(e.w) + frames(e.sk);
    } else if (e.k === "run") {
      var names = ["live", "cached", "free", "stranded", "held"];
      h = "<b>" + e.n + " small blocks, " + bytes(e.s) + "</b>";
      e.b.forEach(function (b, i) { if (b > 0) h += "<br>" + names[i] + " " + bytes(b); });
    } else {
      h = "<b>" + esc(e.k) + " " + bytes(e.s) + "</b><br>" + esc(KINDS[e.k] || "");
    }
    return "<b>" + esc(m.manager) + "</b>: " + h + segment(m, e.g);
  }
  var maps = data.maps.map(function (m) {
    var svg = document.querySelector('svg.map[data-map="' + m.id + '"]');
    svg.addEventListener("mousemove", function (ev) {
      var t = ev.target;
      if (t.classList && t.classList.contains("b")) show(block(m, m.entries[+t.getAttribute("data-i")]), ev);
      else hide();
    });
    svg.addEventListener("mouseleave", hide);
    return { m: m, svg: svg };
  });

  // #selftest: work the controls as a person would and say what was seen.
  function selftest() {
    var out = { charts: [], maps: [], ok: true };
    function fail(why) { out.ok = false; (out.why = out.why || []).push(why); }
    function mouse(el, type, fx, fy) {
      var r = el.getBoundingClientRect();
      var o = { bubbles: true, cancelable: true, clientX: r.left + r.width * fx, clientY: r.top + r.height * fy, view: window };
      el.dispatchEvent(type === "wheel" ? new WheelEvent(type, Object.assign(o, { deltaY: -100 })) : new MouseEvent(type, o));
    }
    var verdicts = document.querySelectorAll(".verdict");
    out.verdicts = Array.prototype.map.call(verdicts, function (v) { return v.offsetHeight > 0 ? v.textContent : ""; });
    out.failed_banner = !!document.getElementById("failed");
    out.axis = Array.prototype.map.call(document.querySelectorAll("svg.chart .xlabel"), function (t) { return t.textContent; });
    charts.forEach(function (c) {
      var ch = c.ch, r = { id: ch.id, width: c.svg.getBoundingClientRect().width };
      r.drawn = Array.prototype.filter.call(c.svg.querySelectorAll("polyline.series"), function (p) {
        return p.getAttribute("points").trim().length > 0;
      }).length;
      r.below = 0;
      ch.series.slice(1).forEach(function (s) {
        if (s.failed) return;
        s.y.forEach(function (y, j) { var l = ch.series[0].y[j]; if (y !== null && l !== null && y < l) r.below++; });
      });
      if (r.below) fail("chart " + ch.id + ": reserved below live at " + r.below + " points");
      mouse(c.hover, "mousemove", 0.5, 0.5);
      r.tip = tip.hidden ? "" : tip.textContent;
      ch.series.forEach(function (s) { if (r.tip.indexOf(s.name) < 0) fail("chart " + ch.id + ": the tip lacks " + s.name); });
      r.ticks_before = c.svg.querySelector(".xticks").textContent;
      mouse(c.hover, "mousedown", 0.25, 0.5);
      mouse(c.hover, "mousemove", 0.5, 0.5);
      mouse(c.hover, "mouseup", 0.5, 0.5);
      var v = c.view();
      r.drag = [v[0] / ch.xmax, v[1] / ch.xmax];
      if (!(Math.abs(r.drag[0] - 0.25) < 0.02 && Math.abs(r.drag[1] - 0.5) < 0.02)) fail("chart " + ch.id + ": a drag did not zoom to its span");
      r.ticks_zoomed = c.svg.querySelector(".xticks").textContent;
      if (r.ticks_zoomed === r.ticks_before) fail("chart " + ch.id + ": zooming did not change the axis");
      mouse(c.hover, "wheel", 0.5, 0.5);
      v = c.view();
      r.wheel = (v[1] - v[0]) / ch.xmax;
      if (!(r.wheel < 0.25)) fail("chart " + ch.id + ": the wheel did not zoom in");
      var reset = document.querySelector('button.reset[data-chart="' + ch.id + '"]');
      reset.click();
      v = c.view();
      if (v[0] !== 0 || v[1] !== ch.xmax) fail("chart " + ch.id + ": reset did not show the whole trace");
      out.charts.push(r);
    });
    maps.forEach(function (mp) {
      var rects = Array.prototype.slice.call(mp.svg.querySelectorAll("rect.b.live"));
      var r = { id: mp.m.id, manager: mp.m.manager, rects: mp.svg.querySelectorAll("rect.b").length, live: rects.length };
      rects.sort(function (a, b) { return b.getAttribute("width") - a.getAttribute("width"); });
      if (rects.length) {
        mouse(rects[0], "mousemove", 0.5, 0.5);
        r.tip = tip.hidden ? "" : tip.textContent;
        if (r.tip.indexOf("live") < 0) fail("map " + mp.m.id + ": no live block's details on hover");
      } else fail("map " + mp.m.id + ": no live block drawn");
      out.maps.push(r);
    });
    hide();
    // Leave a chart's figures showing, for a screenshot.
    if (charts.length) mouse(charts[0].hover, "mousemove", 0.62, 0.5);
    var pre = document.createElement("pre");
    pre.id = "selftest";
    pre.hidden = true;
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
    document.body.setAttribute("data-selftest", out.ok ? "pass" : "fail");
  }
  if (location.hash === "#selftest") selftest();
  document.body.setAttribute("data-ready", "1");
})();
