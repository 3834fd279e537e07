// The chart: a time axis, one row per resource, and only the rows in sight (plus a few) in
// the document, so a thousand hosts cost what thirty do. Rows are drawn as one HTML string
// per frame; events are handled once, on the chart, and find their row from the pointer.

import { MINUTE, parseApi } from "./time.js";

export const ROW_HEIGHT = 26;
const LABEL_WIDTH = 200;
/** Rows drawn beyond the visible ones, so a short scroll shows no blank. */
const OVERSCAN = 10;
/** A drag shorter than this many pixels is a click. */
const DRAG_THRESHOLD = 4;

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export function escapeHtml(text) {
  return String(text ?? "").replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

export function statusClass(status) {
  switch (status) {
    case "PENDING": return "st-pending";
    case "ACTIVE": return "st-active";
    case "TERMINATED": case "DELETED": return "st-ended";
    case "ERROR": return "st-error";
    default: return "st-transition";
  }
}

function el(tag, className, parent) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (parent) parent.append(node);
  return node;
}

export class Gantt {
  /**
   * `handlers`: onVisible(first, last), onOpen(row, interval), onSelect(rows, start, end),
   * onExtend(row, interval, end), onOffer(offer), onPan(deltaMs), onKey(event).
   */
  constructor(root, handlers) {
    this.handlers = handlers;
    this.rows = [];
    this.start = 0;
    this.end = 1;
    this.zone = null;
    this.ticks = [];
    this.snap = 15 * MINUTE;
    this.offers = new Map();
    this.mineOnly = false;
    this.frame = 0;
    this.dirty = true;
    this.drawn = { first: -1, last: -1 };
    this.drag = null;

    root.replaceChildren();
    this.root = el("div", "gantt", root);
    this.axis = el("div", "axis", this.root);
    this.axis.setAttribute("aria-hidden", "true");
    this.axis.title = "Drag to move in time";
    this.corner = el("div", "corner", this.axis);
    this.tickLayer = el("div", "ticks", this.axis);
    this.gridLayer = el("div", "grid-layer", this.root);
    this.gridLayer.setAttribute("aria-hidden", "true");
    Object.assign(this.gridLayer.style, {
      position: "absolute", top: "var(--axis)", bottom: "0", left: `${LABEL_WIDTH}px`,
      pointerEvents: "none", overflow: "hidden",
    });
    this.viewport = el("div", "viewport", this.root);
    this.viewport.tabIndex = 0;
    this.viewport.setAttribute("role", "region");
    this.viewport.setAttribute(
      "aria-label",
      "Reservation chart. Arrow keys left and right move in time, plus and minus zoom, T goes to today; Tab reaches leases.",
    );
    this.spacer = el("div", "spacer-rows", this.viewport);
    this.rowLayer = el("div", "rows", this.spacer);
    this.selection = el("div", "selection", this.spacer);
    this.selection.hidden = true;
    this.nowLine = el("div", "now", this.gridLayer);
    el("span", "", this.nowLine).textContent = "now";

    this.viewport.addEventListener("scroll", () => this.schedule(false), { passive: true });
    new ResizeObserver(() => this.schedule(true)).observe(this.viewport);
    this.viewport.addEventListener("pointerdown", (e) => this.pointerDown(e));
    this.viewport.addEventListener("pointermove", (e) => this.pointerMove(e));
    this.viewport.addEventListener("pointerup", (e) => this.pointerUp(e));
    this.viewport.addEventListener("pointercancel", () => this.cancelDrag());
    this.viewport.addEventListener("click", (e) => this.click(e));
    this.viewport.addEventListener("keydown", (e) => this.handlers.onKey(e));
    this.axis.addEventListener("pointerdown", (e) => this.panStart(e));
    this.axis.addEventListener("pointermove", (e) => this.panMove(e));
    this.axis.addEventListener("pointerup", () => { this.pan = null; });
    this.viewport.addEventListener("wheel", (e) => this.wheel(e), { passive: false });
    setInterval(() => this.drawNow(), 30_000);
  }

  setRows(rows) {
    this.rows = rows;
    this.spacer.style.height = `${rows.length * ROW_HEIGHT}px`;
    this.schedule(true);
  }

  /** Back to the first row: a new filter or resource type is a new list, read from its top. */
  scrollToTop() {
    this.viewport.scrollTop = 0;
    this.schedule(true);
  }

  setWindow(start, end, zone, ticks, snap) {
    Object.assign(this, { start, end, zone, ticks, snap });
    this.schedule(true);
  }

  setOffers(offers) {
    this.offers = offers;
    this.schedule(true);
  }

  setMineOnly(mineOnly) {
    this.mineOnly = mineOnly;
    this.schedule(true);
  }

  /** Draws at the next frame: scrolling coalesces to one draw per frame. */
  schedule(dirty) {
    if (dirty) this.dirty = true;
    if (!this.frame) {
      this.frame = requestAnimationFrame(() => {
        this.frame = 0;
        this.draw();
      });
    }
  }

  get laneWidth() {
    return Math.max(1, this.viewport.clientWidth - LABEL_WIDTH);
  }

  x(ms) {
    return ((ms - this.start) / (this.end - this.start)) * this.laneWidth;
  }

  timeAt(x) {
    return this.start + (x / this.laneWidth) * (this.end - this.start);
  }

  snapTime(ms) {
    return Math.round(ms / this.snap) * this.snap;
  }

  /** Draws now, synchronously; answers the visible row range. */
  draw() {
    const top = this.viewport.scrollTop;
    const height = this.viewport.clientHeight;
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(this.rows.length, Math.ceil((top + height) / ROW_HEIGHT) + OVERSCAN);
    if (this.dirty) this.drawAxis();
    if (this.dirty || first !== this.drawn.first || last !== this.drawn.last) {
      const parts = [];
      for (let i = first; i < last; i++) parts.push(this.rowHtml(i));
      this.rowLayer.innerHTML = parts.join("");
      this.rowLayer.style.transform = `translateY(${first * ROW_HEIGHT}px)`;
      this.drawn = { first, last };
    }
    this.dirty = false;
    this.drawNow();
    this.handlers.onVisible(
      Math.floor(top / ROW_HEIGHT),
      Math.min(this.rows.length, Math.ceil((top + height) / ROW_HEIGHT)),
    );
  }

  drawAxis() {
    this.corner.textContent = this.zone ? this.zone.name : "";
    this.gridLayer.style.width = `${this.laneWidth}px`;
    const ticks = [];
    const grid = [];
    // A label needs room: on a narrow chart, every other one is dropped (the line stays).
    const room = { major: 40, minor: 38 };
    const lastLabel = { major: -Infinity, minor: -Infinity };
    for (const t of this.ticks) {
      const x = this.x(t.ms);
      if (x < -1 || x > this.laneWidth) continue;
      const kind = t.major ? "major" : "minor";
      if (x - lastLabel[kind] >= room[kind]) {
        ticks.push(`<div class="tick ${kind}" style="left:${x.toFixed(1)}px">${escapeHtml(t.label)}</div>`);
        lastLabel[kind] = x;
      }
      grid.push(`<div class="gridline ${kind}" style="left:${x.toFixed(1)}px"></div>`);
    }
    this.tickLayer.innerHTML = ticks.join("");
    this.gridLayer.querySelectorAll(".gridline").forEach((n) => n.remove());
    this.gridLayer.insertAdjacentHTML("afterbegin", grid.join(""));
  }

  drawNow() {
    const x = this.x(Date.now());
    this.nowLine.hidden = x < 0 || x > this.laneWidth;
    this.nowLine.style.left = `${x}px`;
  }

  /** Left and width of [start, end) clipped to the window, or null when outside. */
  span(start, end) {
    if (end <= this.start || start >= this.end) return null;
    const x0 = Math.max(0, this.x(start));
    const x1 = Math.min(this.laneWidth, this.x(end));
    return { left: x0, width: Math.max(3, x1 - x0) };
  }

  rowHtml(i) {
    const row = this.rows[i];
    if (row.kind === "group") {
      return `<div class="row group" data-row="${i}"><div class="label">${escapeHtml(row.label)}</div></div>`;
    }
    if (row.kind === "loading") {
      return `<div class="row loading" data-row="${i}"><div class="label">${escapeHtml(row.label)}</div></div>`;
    }
    const r = row.resource;
    const parts = [];
    const mark = r.reservable ? "" : '<span class="mark" title="not reservable">&#9888; not reservable</span>';
    parts.push(`<div class="row" data-row="${i}"><div class="label" title="${escapeHtml(r.name)}">${escapeHtml(r.name)}${mark}</div><div class="lane">`);
    for (const p of r.non_reservable || []) {
      const s = this.span(parseApi(p.start_date), parseApi(p.end_date));
      if (s) parts.push(`<div class="shade" style="left:${s.left}px;width:${s.width}px" title="not reservable"></div>`);
    }
    if (r.instance_capacity) parts.push(this.bandHtml(r));
    let slotBars = 0;
    r.busy.forEach((b, j) => {
      if (b.allocation === "instances") {
        // A lease whose name the caller may see is a thin bar on the band, to open it.
        if (!b.lease_id || !b.slots || (this.mineOnly && !b.own)) return;
        const s = this.span(parseApi(b.start_date), parseApi(b.end_date));
        if (!s) return;
        const who = b.own ? "" : ` (project ${b.project_id})`;
        const when = `${this.zone.formatDateTime(parseApi(b.start_date))} to ${this.zone.formatDateTime(parseApi(b.end_date))}`;
        const label = `Lease ${b.lease_name}${who}, ${b.slots.units} instance slot(s) of ${b.slots.vcpus} vCPU, ${b.status.toLowerCase()}, ${when}`;
        const style = `left:${s.left.toFixed(1)}px;width:${s.width.toFixed(1)}px;bottom:${1 + (slotBars % 3) * 6}px`;
        slotBars += 1;
        parts.push(`<button type="button" class="bar slots ${statusClass(b.status)}" data-row="${i}" data-b="${j}" style="${style}" aria-label="${escapeHtml(label)}" title="${escapeHtml(label)}"></button>`);
        return;
      }
      if (b.allocation !== "whole") return;
      if (this.mineOnly && !b.own) return;
      const start = parseApi(b.start_date);
      const end = parseApi(b.end_date);
      const until = b.blocked_until ? parseApi(b.blocked_until) : end;
      const s = this.span(start, until);
      if (!s) return;
      const when = `${this.zone.formatDateTime(start)} to ${this.zone.formatDateTime(end)}`;
      const style = `left:${s.left.toFixed(1)}px;width:${s.width.toFixed(1)}px`;
      if (!b.lease_id) {
        parts.push(`<div class="bar busy" style="${style}" title="busy, ${escapeHtml(when)}"></div>`);
        return;
      }
      const degraded = b.degraded ? " degraded" : "";
      const who = b.own ? "" : ` (project ${b.project_id})`;
      const text = `${b.degraded ? "\u26a0 " : ""}${b.lease_name}${who}`;
      const label = `Lease ${b.lease_name}${who}, ${b.status.toLowerCase()}${b.degraded ? ", degraded" : ""}, ${when}`;
      let inner = escapeHtml(text);
      if (until > end && until > this.start) {
        const ms = s.width * ((until - Math.max(end, this.start)) / (until - Math.max(start, this.start)));
        inner += `<span class="margin" style="width:${Math.max(0, ms).toFixed(1)}px"></span>`;
      }
      const extendable = b.own && ["PENDING", "ACTIVE"].includes(b.status) && end <= this.end;
      if (extendable) inner += '<span class="handle" data-handle="1" title="Drag to extend"></span>';
      parts.push(`<button type="button" class="bar ${statusClass(b.status)}${degraded}" data-row="${i}" data-b="${j}" style="${style}" aria-label="${escapeHtml(label)}" title="${escapeHtml(label)}">${inner}</button>`);
    });
    for (const offer of this.offers.get(r.id) || []) {
      const s = this.span(offer.start, offer.end);
      if (!s) continue;
      const label = `Book offer ${offer.index + 1}: ${this.zone.formatDateTime(offer.start)} to ${this.zone.formatDateTime(offer.end)}`;
      parts.push(`<button type="button" class="offer" data-offer="${offer.index}" style="left:${s.left}px;width:${s.width}px" aria-label="${escapeHtml(label)}" title="${escapeHtml(label)}">offer ${offer.index + 1}</button>`);
    }
    parts.push("</div></div>");
    return parts.join("");
  }

  /** Instance slots in use over time, as a band whose height is the share of vCPUs used. */
  bandHtml(r) {
    const capacity = r.instance_capacity.vcpus || 1;
    const changes = new Map();
    let any = false;
    for (const b of r.busy) {
      if (b.allocation !== "instances" || !b.slots) continue;
      if (this.mineOnly && !b.own) continue;
      any = true;
      const used = b.slots.units * b.slots.vcpus;
      const s = parseApi(b.start_date);
      const e = parseApi(b.blocked_until || b.end_date);
      changes.set(s, (changes.get(s) || 0) + used);
      changes.set(e, (changes.get(e) || 0) - used);
    }
    if (!any) return "";
    const times = [...changes.keys()].sort((a, b) => a - b);
    const out = [];
    let used = 0;
    for (let k = 0; k < times.length - 1; k++) {
      used += changes.get(times[k]);
      if (used <= 0) continue;
      const s = this.span(times[k], times[k + 1]);
      if (!s) continue;
      const share = Math.min(1, used / capacity);
      out.push(`<div class="band" style="left:${s.left}px;width:${s.width}px;height:${(share * 100).toFixed(0)}%" title="${used} of ${capacity} vCPUs reserved for instances"></div>`);
    }
    return out.join("");
  }

  /** Where a pointer event is: the row index and the x inside the lanes. */
  locate(e) {
    const box = this.spacer.getBoundingClientRect();
    return {
      row: Math.floor((e.clientY - box.top) / ROW_HEIGHT),
      x: e.clientX - box.left - LABEL_WIDTH,
    };
  }

  pointerDown(e) {
    if (e.button !== 0) return;
    const at = this.locate(e);
    const handle = e.target.closest("[data-handle]");
    if (handle) {
      const bar = handle.closest(".bar");
      const row = Number(bar.dataset.row);
      const interval = this.rows[row].resource.busy[Number(bar.dataset.b)];
      this.drag = { kind: "extend", row, interval, x0: at.x, bar };
      this.viewport.setPointerCapture(e.pointerId);
      e.preventDefault();
      return;
    }
    if (e.target.closest(".bar, .offer") || at.x < 0) return;
    const row = this.rows[at.row];
    if (!row || row.kind !== "resource") return;
    this.drag = { kind: "select", row0: at.row, x0: at.x, row1: at.row, x1: at.x };
    this.viewport.setPointerCapture(e.pointerId);
  }

  pointerMove(e) {
    const drag = this.drag;
    if (!drag) return;
    const at = this.locate(e);
    if (drag.kind === "extend") {
      let ghost = this.spacer.querySelector(".ghost");
      if (!ghost) ghost = el("div", "ghost", this.spacer);
      const start = Math.max(this.start, parseApi(drag.interval.start_date));
      const end = this.snapTime(this.timeAt(Math.max(0, Math.min(this.laneWidth, at.x))));
      ghost.style.top = `${drag.row * ROW_HEIGHT + 3}px`;
      ghost.style.height = `${ROW_HEIGHT - 6}px`;
      ghost.style.left = `${LABEL_WIDTH + this.x(start)}px`;
      ghost.style.width = `${Math.max(2, this.x(end) - this.x(start))}px`;
      ghost.title = this.zone.formatDateTime(end);
      drag.end = end;
      return;
    }
    drag.row1 = Math.max(0, Math.min(this.rows.length - 1, at.row));
    drag.x1 = Math.max(0, Math.min(this.laneWidth, at.x));
    const [a, b] = [Math.min(drag.x0, drag.x1), Math.max(drag.x0, drag.x1)];
    if (b - a < DRAG_THRESHOLD) return;
    const [r0, r1] = [Math.min(drag.row0, drag.row1), Math.max(drag.row0, drag.row1)];
    const start = this.snapTime(this.timeAt(a));
    const end = this.snapTime(this.timeAt(b));
    Object.assign(this.selection.style, {
      top: `${r0 * ROW_HEIGHT}px`, height: `${(r1 - r0 + 1) * ROW_HEIGHT}px`,
      left: `${LABEL_WIDTH + this.x(start)}px`, width: `${Math.max(2, this.x(end) - this.x(start))}px`,
    });
    this.selection.hidden = false;
  }

  pointerUp(e) {
    const drag = this.drag;
    this.drag = null;
    if (!drag) return;
    if (this.viewport.hasPointerCapture(e.pointerId)) this.viewport.releasePointerCapture(e.pointerId);
    if (drag.kind === "extend") {
      this.spacer.querySelector(".ghost")?.remove();
      this.suppressClick = true;
      if (drag.end) this.handlers.onExtend(this.rows[drag.row], drag.interval, drag.end);
      return;
    }
    this.selection.hidden = true;
    const [a, b] = [Math.min(drag.x0, drag.x1), Math.max(drag.x0, drag.x1)];
    if (b - a < DRAG_THRESHOLD) return;
    const [r0, r1] = [Math.min(drag.row0, drag.row1), Math.max(drag.row0, drag.row1)];
    const rows = this.rows.slice(r0, r1 + 1).filter((r) => r.kind === "resource");
    const start = this.snapTime(this.timeAt(a));
    const end = this.snapTime(this.timeAt(b));
    if (rows.length && end > start) this.handlers.onSelect(rows, start, end);
  }

  cancelDrag() {
    this.drag = null;
    this.selection.hidden = true;
    this.spacer.querySelector(".ghost")?.remove();
  }

  click(e) {
    if (this.suppressClick) {
      this.suppressClick = false;
      return;
    }
    const offer = e.target.closest("[data-offer]");
    if (offer) {
      this.handlers.onOffer(Number(offer.dataset.offer));
      return;
    }
    const bar = e.target.closest("button.bar");
    if (bar) {
      const row = this.rows[Number(bar.dataset.row)];
      this.handlers.onOpen(row, row.resource.busy[Number(bar.dataset.b)]);
    }
  }

  panStart(e) {
    this.pan = { x: e.clientX };
    this.axis.setPointerCapture(e.pointerId);
  }

  panMove(e) {
    if (!this.pan) return;
    const dx = e.clientX - this.pan.x;
    if (Math.abs(dx) < 2) return;
    this.pan.x = e.clientX;
    this.handlers.onPan(-(dx / this.laneWidth) * (this.end - this.start));
  }

  wheel(e) {
    // Sideways scrolling (or shift and the wheel) moves in time; plain wheel scrolls rows.
    const dx = e.shiftKey ? e.deltaY : e.deltaX;
    if (Math.abs(dx) <= Math.abs(e.shiftKey ? 0 : e.deltaY)) return;
    e.preventDefault();
    this.handlers.onPan((dx / this.laneWidth) * (this.end - this.start));
  }

  /** Scrolls so that row `index` is in sight. */
  reveal(index) {
    const top = index * ROW_HEIGHT;
    const vp = this.viewport;
    if (top < vp.scrollTop || top + ROW_HEIGHT > vp.scrollTop + vp.clientHeight) {
      vp.scrollTop = Math.max(0, top - vp.clientHeight / 3);
    }
  }
}

