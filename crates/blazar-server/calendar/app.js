// The calendar page: what is shown (type, window, zone, filters), loading the timeline a
// page of resources at a time as rows come into sight, and the wiring of controls, chart
// and panels.

import { api, session, traffic, ApiError } from "./api.js";
import { Gantt } from "./gantt.js";
import { Panels } from "./panels.js";
import { DAY, HOUR, MINUTE, Zone, parseApi, toApi } from "./time.js";

/** Resources per timeline request: a screenful and a half at the smallest row height. */
const PAGE = 100;
/** Start loading the next page when this few loaded rows remain below the visible ones. */
const PREFETCH_ROWS = 40;

export const TYPES = {
  hosts: { label: "Hosts", path: "v1/os-hosts", resourceType: "physical:host", noun: "host" },
  floatingips: { label: "Floating IPs", path: "v1/floatingips", resourceType: "virtual:floatingip", noun: "floating IP" },
  networks: { label: "Networks", path: "v1/networks", resourceType: "network", noun: "network segment" },
  devices: { label: "Devices", path: "v1/devices", resourceType: "device", noun: "device" },
};

const ZOOMS = {
  day: { days: 1, before: 0, snap: 15 * MINUTE, step: HOUR },
  week: { days: 7, before: 1, snap: HOUR, step: 6 * HOUR },
  month: { days: 31, before: 3, snap: 6 * HOUR, step: DAY },
};

const $ = (id) => document.getElementById(id);

const authMode = document.querySelector('meta[name="blazar-auth-mode"]')?.content || "noauth";

const state = {
  type: "hosts",
  zoom: "week",
  zone: new Zone(false),
  start: 0,
  query: "",
  groupBy: "",
  name: "",
  mine: false,
  segments: [],
  generation: 0,
  loading: false,
  offers: [],
  visible: { first: 0, last: 0 },
};

/** What the browser test reads: when data arrived and how long drawing it took. */
export const metrics = { renders: [], traffic, lastError: null, complete: false };
window.calendarMetrics = metrics;

function status(text, isError = false) {
  const node = $("status");
  node.textContent = text;
  node.classList.toggle("error", isError);
}

function end() {
  return state.zone.addDays(state.start, ZOOMS[state.zoom].days);
}

function ticks() {
  const out = [];
  const stop = end();
  for (let day = state.zone.startOfDay(state.start); day < stop; day = state.zone.addDays(day, 1)) {
    const label = state.zoom === "month"
      ? new Intl.DateTimeFormat(undefined, { timeZone: state.zone.utc ? "UTC" : undefined, day: "numeric" }).format(day)
      : state.zone.day.format(day);
    out.push({ ms: day, label, major: true });
    if (state.zoom === "month") continue;
    const every = state.zoom === "day" ? 2 * HOUR : 6 * HOUR;
    for (let t = day + every; t < state.zone.addDays(day, 1); t += every) {
      out.push({ ms: t, label: state.zone.hour.format(t), major: false });
    }
  }
  return out;
}

function updateRange() {
  const z = state.zone;
  $("range").textContent = `${z.day.format(state.start)} – ${z.day.format(end() - 1)} (${z.name})`;
  gantt.setWindow(state.start, end(), z, ticks(), ZOOMS[state.zoom].snap);
}

/** The user's query combined with a group's condition. */
function combinedQuery(condition) {
  const own = state.query.trim();
  if (!condition) return own;
  if (!own) return JSON.stringify(condition);
  return JSON.stringify(["and", JSON.parse(own), condition]);
}

/** Starts over: new segments (one per group), nothing loaded, first pages requested. */
async function reload() {
  state.generation += 1;
  const generation = state.generation;
  state.loading = false;
  let segments = [{ label: null, query: combinedQuery(null) }];
  if (state.groupBy) {
    const values = groupValues.get(state.groupBy) || [];
    segments = values.map((value) => ({
      label: `${state.groupBy} = ${value}`,
      query: combinedQuery(["==", `$${state.groupBy}`, value]),
    }));
    // The query language cannot ask for a property's absence: the last group pages through
    // everything the filter matches and keeps what no group above holds (they are complete
    // by the time it loads, since segments load in order).
    segments.push({ label: `${state.groupBy} not set`, query: combinedQuery(null), rest: true });
  }
  try {
    if (state.query.trim()) JSON.parse(state.query);
  } catch {
    status("The property filter is not valid JSON (Blazar's query language, e.g. [\"==\", \"$node_type\", \"compute\"])", true);
    return;
  }
  state.segments = segments.map((s) => ({ ...s, resources: [], marker: null, done: false }));
  rebuildRows();
  await loadMore(generation);
}

/** Whether every page must be loaded: filters applied in the browser need them all. */
function needsAll() {
  return state.name.trim() !== "" || state.mine;
}

/** Loads the next page of the first segment still incomplete, while rows are needed. */
async function loadMore(generation) {
  if (state.loading || generation !== state.generation) return;
  const segment = state.segments.find((s) => !s.done);
  metrics.complete = !segment;
  if (!segment) {
    status(summary());
    return;
  }
  const loadedRows = gantt.rows.findIndex((r) => r.kind === "loading");
  const wanted = needsAll() || loadedRows < 0 || loadedRows < state.visible.last + PREFETCH_ROWS;
  if (!wanted) return;
  state.loading = true;
  const params = new URLSearchParams({ start: toApi(state.start), end: toApi(end()), limit: String(PAGE) });
  if (segment.query) params.set("query", segment.query);
  if (segment.marker) params.set("marker", segment.marker);
  status(`Loading ${TYPES[state.type].label.toLowerCase()}…`);
  const bytesBefore = traffic.bytes;
  let page;
  try {
    page = await api("GET", `${TYPES[state.type].path}/timeline?${params}`);
  } catch (error) {
    state.loading = false;
    if (generation !== state.generation) return;
    metrics.lastError = error.message;
    status(explainText(error), true);
    if (error instanceof ApiError && error.status === 401) panels.askSignIn("Your session has ended; sign in again.");
    return;
  } finally {
    if (generation === state.generation) state.loading = false;
  }
  if (generation !== state.generation) return;
  const arrived = performance.now();
  segment.resources.push(...page.timeline.resources);
  segment.marker = page.timeline.next_marker;
  segment.done = !segment.marker;
  rebuildRows();
  gantt.draw();
  // Drawn is not painted: the next frame after the draw is when the user sees it.
  requestAnimationFrame(() => setTimeout(() => {
    metrics.renders.push({
      resources: page.timeline.resources.length,
      bytes: traffic.bytes - bytesBefore,
      ms: performance.now() - arrived,
      zoom: state.zoom,
      totalRows: gantt.rows.length,
    });
  }, 0));
  status(summary());
  queueMicrotask(() => loadMore(generation));
}

function summary() {
  // The "not set" group reads resources the groups above hold too: count each once.
  const loaded = new Set(state.segments.flatMap((s) => s.resources.map((r) => r.id))).size;
  const more = state.segments.some((s) => !s.done) ? " (more below)" : "";
  const shown = gantt.rows.filter((r) => r.kind === "resource").length;
  const noun = TYPES[state.type].label.toLowerCase();
  return `${shown} of ${loaded} ${noun} shown${more}.`;
}

function explainText(error) {
  return error.message;
}

/** The chart's rows from the loaded segments, with the browser-side filters applied. */
function rebuildRows() {
  const rows = [];
  const name = state.name.trim().toLowerCase();
  const grouped = new Set();
  for (const segment of state.segments) {
    const matching = segment.resources.filter((r) =>
      !(segment.rest && grouped.has(r.id)) &&
      (!name || r.name.toLowerCase().includes(name)) &&
      (!state.mine || r.busy.some((b) => b.own)));
    if (!segment.rest) for (const r of segment.resources) grouped.add(r.id);
    // A group that finished with nothing in it is noise: only the values that match are shown.
    if (segment.done && !matching.length) continue;
    if (segment.label) rows.push({ kind: "group", label: `${segment.label} (${matching.length}${segment.done ? "" : "+"})` });
    for (const resource of matching) rows.push({ kind: "resource", resource, type: state.type });
    if (!segment.done) rows.push({ kind: "loading", label: "Loading more…" });
  }
  if (!rows.length) rows.push({ kind: "group", label: `No ${TYPES[state.type].label.toLowerCase()} match.` });
  gantt.setRows(rows);
}

const groupValues = new Map();

/** The properties the caller may group by, with their values, for the type shown. */
async function loadProperties() {
  const select = $("group-by");
  select.replaceChildren(new Option("nothing", ""));
  groupValues.clear();
  try {
    // The timeline's own listing: members may read it, unlike the inventory's properties.
    const answer = await api("GET", `${TYPES[state.type].path}/timeline/properties`);
    for (const p of answer.resource_properties || []) {
      if (!Array.isArray(p.values) || !p.values.length) continue;
      groupValues.set(p.property, p.values);
      select.append(new Option(p.property, p.property));
    }
  } catch (error) {
    // Grouping is a convenience; the chart works without it.
    console.warn("no properties to group by:", error.message);
  }
  select.value = groupValues.has(state.groupBy) ? state.groupBy : "";
  state.groupBy = select.value;
}

function goToday() {
  const zoom = ZOOMS[state.zoom];
  state.start = state.zone.addDays(Date.now(), -zoom.before);
}

function setPressed(containerId, attribute, value) {
  for (const b of $(containerId).querySelectorAll("button")) {
    b.setAttribute("aria-pressed", String(b.dataset[attribute] === value));
  }
}

let reloadTimer = 0;
/** Moves the window at once and asks for its data once the user pauses. */
function shift(ms) {
  state.start += ms;
  updateRange();
  clearTimeout(reloadTimer);
  reloadTimer = setTimeout(reload, 250);
}

function zoomTo(zoom) {
  const middle = state.start + (end() - state.start) / 2;
  state.zoom = zoom;
  setPressed("zooms", "zoom", zoom);
  const days = ZOOMS[zoom].days;
  state.start = zoom === "day" ? state.zone.startOfDay(middle) : state.zone.addDays(middle, -Math.floor(days / 2));
  updateRange();
  reload();
}

function onKey(e) {
  if (e.target !== gantt.viewport) return;
  const step = ZOOMS[state.zoom].step;
  const order = ["day", "week", "month"];
  const i = order.indexOf(state.zoom);
  if (e.key === "ArrowLeft") shift(-step);
  else if (e.key === "ArrowRight") shift(step);
  else if (e.key === "+" || e.key === "=") { if (i > 0) zoomTo(order[i - 1]); }
  else if (e.key === "-") { if (i < order.length - 1) zoomTo(order[i + 1]); }
  else if (e.key === "t" || e.key === "T") { goToday(); updateRange(); reload(); }
  else return;
  e.preventDefault();
}

const gantt = new Gantt($("chart"), {
  onVisible(first, last) {
    state.visible = { first, last };
    loadMore(state.generation);
  },
  onOpen(row, interval) {
    panels.showLease(interval.lease_id);
  },
  onSelect(rows, start, end) {
    panels.showBooking({ type: state.type, resources: rows.map((r) => r.resource), start, end });
  },
  onExtend(row, interval, newEnd) {
    panels.extend(interval.lease_id, parseApi(interval.end_date), newEnd);
  },
  onOffer(index) {
    panels.bookOffer(index);
  },
  onPan: (ms) => shift(ms),
  onKey,
});

const panels = new Panels({
  zone: () => state.zone,
  type: () => state.type,
  types: TYPES,
  authMode,
  changed: () => reload(),
  showOffers(offers) {
    // Offers drawn on the rows of the resources they would grant.
    const byResource = new Map();
    offers.forEach((offer, index) => {
      for (const r of offer.reservations) {
        for (const resource of r.resources) {
          const list = byResource.get(resource.id) || [];
          list.push({ index, start: parseApi(offer.start_date), end: parseApi(offer.end_date) });
          byResource.set(resource.id, list);
        }
      }
    });
    gantt.setOffers(byResource);
    if (offers.length) {
      const first = parseApi(offers[0].start_date);
      if (first < state.start || first >= end()) {
        state.start = state.zone.addDays(first, -ZOOMS[state.zoom].before);
        updateRange();
        reload();
      }
    }
  },
  identityChanged: () => showIdentity(),
});

function showIdentity() {
  const who = session.who;
  const signedIn = Boolean(session.token);
  $("identity").textContent = signedIn
    ? `Signed in${who?.user?.name ? ` as ${who.user.name}` : ""}${who?.project?.name ? ` (${who.project.name})` : ""}`
    : authMode === "noauth" ? "No authentication: the server's default identity" : "Not signed in";
  $("sign-in-button").hidden = signedIn;
  $("sign-out-button").hidden = !signedIn;
}

function wire() {
  $("types").addEventListener("click", async (e) => {
    const type = e.target.closest("button")?.dataset.type;
    if (!type || type === state.type) return;
    state.type = type;
    setPressed("types", "type", type);
    gantt.setOffers(new Map());
    gantt.scrollToTop();
    await loadProperties();
    reload();
  });
  $("zooms").addEventListener("click", (e) => {
    const zoom = e.target.closest("button")?.dataset.zoom;
    if (zoom) zoomTo(zoom);
  });
  $("earlier").addEventListener("click", () => shift(-(end() - state.start)));
  $("later").addEventListener("click", () => shift(end() - state.start));
  $("today").addEventListener("click", () => { goToday(); updateRange(); reload(); });
  $("zone").addEventListener("change", (e) => {
    state.zone = new Zone(e.target.value === "utc");
    updateRange();
    panels.refresh();
  });
  $("filters").addEventListener("submit", (e) => {
    e.preventDefault();
    state.query = $("query").value;
    state.groupBy = $("group-by").value;
    state.name = $("name-search").value;
    state.mine = $("mine").checked;
    gantt.setMineOnly(state.mine);
    gantt.scrollToTop();
    reload();
  });
  $("mine").addEventListener("change", (e) => {
    state.mine = e.target.checked;
    gantt.setMineOnly(state.mine);
    rebuildRows();
    loadMore(state.generation);
  });
  $("name-search").addEventListener("input", (e) => {
    state.name = e.target.value;
    rebuildRows();
    loadMore(state.generation);
  });
  $("find-slot-button").addEventListener("click", () => panels.showFindSlot());
  $("book-button").addEventListener("click", () => {
    const start = Math.ceil((Date.now() + 5 * MINUTE) / HOUR) * HOUR;
    panels.showBooking({ type: state.type, resources: [], start, end: start + 4 * HOUR });
  });
  $("sign-in-button").addEventListener("click", () => panels.askSignIn());
  $("sign-out-button").addEventListener("click", () => {
    session.clear();
    showIdentity();
    reload();
  });
  window.addEventListener("calendar-signed-in", () => { showIdentity(); loadProperties().then(reload); });
}

async function start() {
  $("zone-local").textContent = `Local (${new Zone(false).name})`;
  wire();
  showIdentity();
  goToday();
  updateRange();
  if (authMode !== "noauth" && !session.token) {
    status("Sign in to see the calendar.");
    panels.askSignIn();
    return;
  }
  await loadProperties();
  await reload();
}

start();
