// Drives /calendar in Debian's chromium (headless, through playwright-core) against servers
// that scripts/calendar/test.sh started and seeded: an admin (noauth) server and a
// `tokens` server on the same database. Checks what a user does (filter, find a slot and
// book it, see it, open it, extend it, drag to book, keyboard, sign in with a token, what a
// member may see), runs axe-core, measures render time and bytes per screen, and writes
// screenshots and metrics.json to the artifacts directory.
//
// Usage: node browser-test.mjs ADMIN_URL TOKENS_URL MEMBER_TOKEN ARTIFACTS_DIR

import { readFileSync, writeFileSync, mkdirSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const [adminUrl, tokensUrl, memberToken, artifacts] = process.argv.slice(2);
mkdirSync(artifacts, { recursive: true });
const require = createRequire(import.meta.url);
const axeSource = readFileSync(require.resolve("axe-core/axe.min.js"), "utf8");

const metrics = {};
const failures = [];
let step = "start";
const t0 = Date.now();
function log(message) {
  console.log(`calendar test [${((Date.now() - t0) / 1000).toFixed(1)} s] ${message}`);
}
function check(condition, message) {
  if (!condition) {
    failures.push(`${step}: ${message}`);
    console.error(`FAILED ${step}: ${message}`);
  }
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});

/** A fresh tab that records CSP violations and script errors as failures. */
async function newPage(options = {}) {
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 }, ...options });
  const page = await context.newPage();
  page.on("pageerror", (e) => check(false, `script error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && !/status of 40[139]|status of 409|status of 503/.test(m.text())) {
      check(false, `console error: ${m.text()}`);
    }
  });
  return { context, page };
}

const renders = (page) => page.evaluate(() => window.calendarMetrics.renders.length);
async function waitForRenders(page, count, timeout = 30_000) {
  await page.waitForFunction((n) => window.calendarMetrics.renders.length >= n, count, { timeout });
}
async function shot(page, name) {
  await page.screenshot({ path: `${artifacts}/${name}.png` });
}
async function axe(page, name) {
  await page.evaluate(axeSource);
  const result = await page.evaluate(() => window.axe.run(document, {
    runOnly: { type: "tag", values: ["wcag2a", "wcag2aa", "best-practice"] },
  }));
  const serious = result.violations.filter((v) => ["serious", "critical"].includes(v.impact) ||
    ["color-contrast", "label", "button-name", "region", "scrollable-region-focusable"].includes(v.id));
  for (const v of serious) {
    check(false, `axe ${name}: ${v.id} (${v.impact}) ${v.help}: ${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join(" | ")}`);
  }
  metrics[`axe_${name}`] = { violations: result.violations.map((v) => `${v.id}:${v.impact}`), passes: result.passes.length };
}
async function api(base, method, path, body, token) {
  const headers = { "Content-Type": "application/json" };
  if (token) headers["X-Auth-Token"] = token;
  const r = await fetch(`${base}${path}`, { method, headers, body: body && JSON.stringify(body) });
  return { status: r.status, body: await r.json().catch(() => null) };
}
async function applyFilters(page, { query = "", group = "", name = "", mine = false }) {
  await page.fill("#query", query);
  await page.selectOption("#group-by", group);
  await page.fill("#name-search", name);
  await page.setChecked("#mine", mine);
  const before = await renders(page);
  await page.click("#filters button[type=submit]");
  await waitForRenders(page, before + 1);
}
const labels = (page) => page.$$eval(".row:not(.group):not(.loading) .label", (ns) => ns.map((n) => n.getAttribute("title")));

try {
  // --- The admin's week view of 1,000 hosts: first screen, then every page. ---
  step = "first screen";
  const { page } = await newPage();
  const navigated = Date.now();
  await page.goto(`${adminUrl}/calendar`);
  await waitForRenders(page, 1);
  const first = (await page.evaluate(() => window.calendarMetrics.renders))[0];
  metrics.first_screen = { ...first, load_to_render_ms: Date.now() - navigated };
  log(`first screen: ${first.resources} hosts, ${first.bytes} bytes, drawn in ${first.ms.toFixed(1)} ms`);
  check(first.resources > 0, "no hosts shown");
  check(first.ms < 1000, `first screen took ${first.ms} ms to draw`);
  const rowsInDom = await page.$$eval(".row", (rs) => rs.length);
  check(rowsInDom < 120, `virtualised rows: ${rowsInDom} rows in the document`);
  check(await page.isVisible(".now"), "the now line is shown");
  check((await page.textContent(".axis .corner")).length > 0, "the time zone is shown");
  await shot(page, "week-hosts");

  step = "all 1,000 hosts";
  // Scrolling to the end loads the rest a page at a time; each page is drawn on arrival.
  for (let i = 0; i < 60; i++) {
    const done = await page.evaluate(() => window.calendarMetrics.complete);
    if (done) break;
    await page.evaluate(() => { const v = document.querySelector(".viewport"); v.scrollTop = v.scrollHeight; });
    await page.waitForTimeout(150);
  }
  const all = await page.evaluate(() => window.calendarMetrics.renders);
  const total = all.reduce((n, r) => n + r.resources, 0);
  metrics.all_pages = {
    pages: all.length, resources: total, bytes: all.reduce((n, r) => n + r.bytes, 0),
    max_draw_ms: Math.max(...all.map((r) => r.ms)), draws_ms: all.map((r) => Number(r.ms.toFixed(1))),
  };
  log(`all pages: ${total} hosts in ${all.length} pages, ${metrics.all_pages.bytes} bytes, slowest draw ${metrics.all_pages.max_draw_ms.toFixed(1)} ms`);
  check(total >= 1000, `only ${total} hosts loaded`);
  // A full redraw of the chart holding 1,000 hosts, as a zone switch or a resize does it.
  metrics.full_redraw_1000_ms = await page.evaluate(async () => {
    const t = performance.now();
    document.querySelector("#zone").dispatchEvent(new Event("change"));
    await new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));
    return performance.now() - t;
  });
  check(metrics.full_redraw_1000_ms < 1000, `redraw of 1,000 hosts took ${metrics.full_redraw_1000_ms} ms`);
  // Scrolling: frame times while the rows scroll by a screen at a time.
  metrics.scroll = await page.evaluate(async () => {
    const v = document.querySelector(".viewport");
    v.scrollTop = 0;
    const frames = [];
    let last = performance.now();
    for (let i = 0; i < 40; i++) {
      v.scrollTop += 600;
      await new Promise((r) => requestAnimationFrame(r));
      const now = performance.now();
      frames.push(now - last);
      last = now;
    }
    frames.sort((a, b) => a - b);
    return { frames: frames.length, median_ms: frames[20], p95_ms: frames[37], max_ms: frames[39], rows_in_dom: document.querySelectorAll(".row").length };
  });
  log(`scrolling: median frame ${metrics.scroll.median_ms.toFixed(1)} ms, p95 ${metrics.scroll.p95_ms.toFixed(1)} ms`);

  step = "filter by property";
  await applyFilters(page, { query: '["==", "$node_type", "gpu_rtx6000"]' });
  const gpuHosts = await labels(page);
  check(gpuHosts.length > 0, "the filter shows no host");
  // node_type follows the rack (racks of ten; gpu_rtx6000 is every fourth rack from the third).
  const wrong = gpuHosts.filter((n) => Math.floor((Number(n.slice(5)) - 1) / 10) % 4 !== 2);
  check(wrong.length === 0, `hosts outside the filter: ${wrong.slice(0, 5)}`);
  await applyFilters(page, { query: '["or", ["==", "$node_type", "gpu_rtx6000"], ["==", "$node_type", "storage_hdd"]]', group: "node_type" });
  await shot(page, "grouped-by-node-type");
  // Scrolling down loads every group's pages; the rows are virtualised, so the headings
  // with their final counts are then read a screen at a time from the top.
  for (let i = 0; i < 200 && !(await page.evaluate(() => window.calendarMetrics.complete)); i++) {
    await page.evaluate(() => { const v = document.querySelector(".viewport"); v.scrollTop = v.scrollHeight; });
    await page.waitForTimeout(100);
  }
  check(await page.evaluate(() => window.calendarMetrics.complete), "the grouped pages did not all load");
  const seen = new Set();
  await page.evaluate(() => { document.querySelector(".viewport").scrollTop = 0; });
  for (let i = 0; i < 200; i++) {
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0))));
    for (const g of await page.$$eval(".row.group .label", (ns) => ns.map((n) => n.textContent))) seen.add(g);
    const bottom = await page.evaluate(() => {
      const v = document.querySelector(".viewport");
      const at = v.scrollTop + v.clientHeight >= v.scrollHeight - 1;
      v.scrollTop += v.clientHeight;
      return at;
    });
    if (bottom) break;
  }
  const groups = [...seen].sort();
  // One heading per matching node type with its full count; the two other types are hidden.
  const registered = (await api(adminUrl, "GET", "/v1/os-hosts")).body.hosts;
  const count = (t) => registered.filter((h) => h.node_type === t).length;
  const expected = ["gpu_rtx6000", "storage_hdd"].map((t) => `node_type = ${t} (${count(t)})`);
  check(count("gpu_rtx6000") > 0 && JSON.stringify(groups) === JSON.stringify(expected),
    `groups: ${[...seen]}; expected ${expected}`);

  step = "find a slot and book it";
  await applyFilters(page, { query: '["==", "$node_type", "storage_hdd"]' });
  await page.click("#find-slot-button");
  await page.fill("#slot-form [name=count]", "2");
  await page.fill("#slot-form [name=query]", '["==", "$node_type", "storage_hdd"]');
  await page.fill("#slot-form [name=hours]", "3");
  await page.fill("#slot-form [name=days]", "7");
  await page.fill("#slot-form [name=name]", "found-slot");
  await page.click("#slot-form button[type=submit]");
  await page.waitForSelector("#slot-result .offers li", { timeout: 20_000 });
  await page.waitForSelector(".lane .offer", { timeout: 20_000 });
  await shot(page, "offers");
  await page.click(".lane .offer");
  await page.waitForSelector("#lease-result .ok", { timeout: 20_000 });
  check((await page.textContent("#panel-title")).includes("found-slot"), "the booked lease's panel opens");
  const leases = (await api(adminUrl, "GET", "/v1/leases")).body.leases;
  const booked = leases.find((l) => l.name === "found-slot");
  check(booked, "the booked lease exists");
  const bookedHosts = (await api(adminUrl, "GET", `/v1/leases/${booked.id}/hosts`)).body.hosts.map((h) => h.hypervisor_hostname);
  check(bookedHosts.length === 2, `booked ${bookedHosts.length} hosts`);

  step = "see the lease appear and open its panel";
  await applyFilters(page, { query: '["==", "$node_type", "storage_hdd"]', name: bookedHosts[0] });
  const bar = `button.bar[aria-label^="Lease found-slot"]`;
  await page.waitForSelector(bar, { timeout: 20_000 });
  await page.click(bar);
  await page.waitForFunction(() => document.querySelector("#panel-title").textContent.includes("found-slot"));
  await page.waitForSelector("#panel-body h3");
  const panelText = await page.textContent("#panel-body");
  check(panelText.includes("physical:host") && bookedHosts.every((h) => panelText.includes(h)),
    "the panel shows the reservation and its hosts");
  await shot(page, "lease-panel");

  step = "extend from the panel, and past what is free";
  // The extension check first: the latest end the lease can reach keeping its hosts.
  const check0 = (await api(adminUrl, "GET", `/v1/leases/${booked.id}/extension?prolong_for=1h`)).body.extension;
  const latest = check0.latest_end_date;
  check(latest && latest >= booked.end_date, `latest end: ${JSON.stringify(check0)}`);
  if (latest > booked.end_date) {
    const latestInput = await page.evaluate((t) => {
      const d = new Date(Date.parse(t.slice(0, 19) + "Z"));
      return new Date(d - d.getTimezoneOffset() * 60_000).toISOString().slice(0, 16);
    }, latest);
    await page.fill("#extend-form [name=end]", latestInput);
    await page.click("#extend-form button[type=submit]");
    await page.waitForFunction(() => /Extended to|refusal/.test(document.querySelector("#panel-body").innerHTML), null, { timeout: 20_000 });
    const after = (await api(adminUrl, "GET", `/v1/leases/${booked.id}`)).body.lease.end_date;
    check(after.slice(0, 16) === latest.slice(0, 16), `extended to ${after}, latest ${latest}`);
  }
  await page.fill("#extend-form [name=end]", await page.evaluate(() => {
    const d = new Date(Date.now() + 27 * 86400_000);
    return new Date(d - d.getTimezoneOffset() * 60_000).toISOString().slice(0, 16);
  }));
  await page.click("#extend-form button[type=submit]");
  await page.waitForSelector("#panel-body .refusal", { timeout: 20_000 });
  const extensionRefusal = await page.textContent("#panel-body .refusal");
  check(/latest end|cannot be extended/i.test(extensionRefusal), `extension refusal: ${extensionRefusal}`);
  await shot(page, "extension-refused");

  step = "a host without the grouped property, and an instance lease opened from its band";
  const loner = await api(adminUrl, "POST", "/v1/os-hosts",
    { name: "loner-1", vcpus: 8, memory_mb: 16384, local_gb: 100 });
  check(loner.status === 201, `loner host: ${loner.status} ${JSON.stringify(loner.body)}`);
  const at = (ms) => new Date(ms).toISOString().slice(0, 16).replace("T", " ");
  const slotsStart = Math.ceil((Date.now() + 3600_000) / 3600_000) * 3600_000;
  const slots = await api(adminUrl, "POST", "/v1/leases", {
    name: "slots-on-loner", start_date: at(slotsStart), end_date: at(slotsStart + 4 * 3600_000),
    events: [],
    reservations: [{
      resource_type: "virtual:instance", amount: 2, vcpus: 2, memory_mb: 2048, disk_gb: 10,
      affinity: null, resource_properties: '["==", "$hypervisor_hostname", "loner-1"]',
    }],
  });
  check(slots.status === 201, `instance lease: ${slots.status} ${JSON.stringify(slots.body)}`);
  await applyFilters(page, { group: "node_type", name: "loner" });
  // A name search loads every group's pages before it can say what matches.
  await page.waitForFunction(() => window.calendarMetrics.complete, null, { timeout: 30_000 });
  await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0))));
  const lonerGroups = await page.$$eval(".row.group .label", (ns) => ns.map((n) => n.textContent));
  check(JSON.stringify(lonerGroups) === JSON.stringify(["node_type not set (1)"]),
    `groups of a host without node_type: ${lonerGroups}`);
  const slotBar = `button.bar.slots[aria-label^="Lease slots-on-loner"]`;
  await page.waitForSelector(slotBar, { timeout: 20_000 });
  await page.click(slotBar);
  await page.waitForFunction(() => document.querySelector("#panel-title").textContent.includes("slots-on-loner"));
  await page.waitForSelector("#panel-body h3");
  check((await page.textContent("#panel-body")).includes("virtual:instance"),
    "the instance lease's panel shows its reservation");
  await shot(page, "instance-lease-panel");

  step = "a refused booking shows the server's reasons";
  await applyFilters(page, {});
  await page.click("#book-button");
  await page.fill("#book-form [name=count]", "5000");
  await page.click("#book-form button[type=submit]");
  await page.waitForSelector("#book-result .refusal", { timeout: 20_000 });
  const refusal = await page.textContent("#book-result .refusal");
  check(/Not enough hosts/.test(refusal) && /requested min 5000/.test(refusal), `refusal: ${refusal}`);
  await shot(page, "refusal");

  step = "drag across free cells to book";
  // Five weeks on, past every seeded lease, all hosts are free.
  for (let i = 0; i < 5; i++) await page.click("#later");
  await page.waitForTimeout(400);
  await waitForRenders(page, (await renders(page)) + 1).catch(() => {});
  await page.waitForSelector(".row:not(.group):not(.loading) .lane");
  const lanes = await page.$$(".row:not(.group):not(.loading) .lane");
  const a = await lanes[0].boundingBox();
  const b = await lanes[2].boundingBox();
  await page.mouse.move(a.x + a.width * 0.2, a.y + a.height / 2);
  await page.mouse.down();
  await page.mouse.move(a.x + a.width * 0.3, b.y + b.height / 2, { steps: 5 });
  await page.mouse.move(a.x + a.width * 0.35, b.y + b.height / 2, { steps: 5 });
  await page.mouse.up();
  await page.waitForSelector("#book-form");
  check((await page.inputValue("#book-form [name=count]")) === "3", "three rows selected");
  check((await page.inputValue("#book-form [name=query]")).includes("hypervisor_hostname"), "the selection names its hosts");
  await page.fill("#book-form [name=name]", "dragged");
  await page.click("#book-form button[type=submit]");
  await page.waitForSelector("#lease-result .ok", { timeout: 20_000 });
  check((await page.textContent("#panel-title")).includes("dragged"), "the dragged lease is booked");

  step = "extend by dragging the end";
  const dragged = (await api(adminUrl, "GET", "/v1/leases")).body.leases.find((l) => l.name === "dragged");
  const handle = `button.bar[aria-label^="Lease dragged"] .handle`;
  await page.waitForSelector(handle, { timeout: 20_000 });
  const box = await page.locator(handle).first().boundingBox();
  await page.mouse.move(box.x + box.width / 2, box.y + box.height / 2);
  await page.mouse.down();
  await page.mouse.move(box.x + 30, box.y + box.height / 2, { steps: 5 });
  await page.mouse.move(box.x + 60, box.y + box.height / 2, { steps: 5 });
  await page.mouse.up();
  await page.waitForFunction(() => /Extended to|refusal/.test(document.querySelector("#panel-body").innerHTML), null, { timeout: 20_000 });
  const draggedAfter = (await api(adminUrl, "GET", `/v1/leases/${dragged.id}`)).body.lease.end_date;
  check(draggedAfter > dragged.end_date, `end moved from ${dragged.end_date} to ${draggedAfter}`);
  metrics.extension = { before: dragged.end_date, after: draggedAfter };

  step = "keyboard navigation";
  await page.click("#today");
  await waitForRenders(page, (await renders(page)) + 1).catch(() => {});
  await page.focus(".viewport");
  const range0 = await page.textContent("#range");
  for (let i = 0; i < 4; i++) await page.keyboard.press("ArrowRight");
  check((await page.textContent("#range")) !== range0, "ArrowRight moves in time");
  await page.keyboard.press("-");
  check((await page.getAttribute('[data-zoom="month"]', "aria-pressed")) === "true", "minus zooms out");
  await shot(page, "month-hosts");
  await page.keyboard.press("+");
  await page.keyboard.press("+");
  check((await page.getAttribute('[data-zoom="day"]', "aria-pressed")) === "true", "plus zooms in");
  await page.keyboard.press("t");
  await page.click('[data-zoom="week"]');
  await waitForRenders(page, (await renders(page)) + 1).catch(() => {});
  await page.focus(".viewport");
  await page.keyboard.press("Tab");
  const focused = await page.evaluate(() => document.activeElement.className + " " + (document.activeElement.getAttribute("aria-label") || ""));
  check(focused.startsWith("bar"), `Tab from the chart reaches a lease (focused: ${focused})`);
  await page.keyboard.press("Enter");
  await page.waitForFunction(() => !document.querySelector("#panel").hidden && document.querySelector("#panel-title").textContent.startsWith("Lease"));
  await page.keyboard.press("Escape");

  step = "time zone";
  await page.selectOption("#zone", "utc");
  check((await page.textContent("#range")).includes("UTC"), "UTC is shown");
  await page.selectOption("#zone", "local");

  step = "accessibility (admin)";
  await axe(page, "admin");
  await page.context().close();

  // --- A member, signing in with a token on the tokens-mode server. ---
  step = "sign in with a token";
  const member = await newPage();
  await member.page.goto(`${tokensUrl}/calendar`);
  await member.page.waitForSelector("#sign-in[open]");
  await shot(member.page, "sign-in");
  await axe(member.page, "sign-in");
  await member.page.fill("#sign-in-form [name=token]", "not-a-token");
  await member.page.click("#sign-in-form button[type=submit]");
  await member.page.waitForFunction(() => document.querySelector("#sign-in-error").textContent.length > 0);
  await member.page.fill("#sign-in-form [name=token]", memberToken);
  await member.page.click("#sign-in-form button[type=submit]");
  await waitForRenders(member.page, 1);
  check(!member.page.url().includes(memberToken), "the token is not in the URL");
  check((await member.page.evaluate(() => document.cookie)) === "", "no cookie");
  check((await member.page.evaluate(() => sessionStorage.getItem("blazar-calendar-token"))) === memberToken, "the token is in session storage");

  step = "a member sees only their own leases named";
  const named = await member.page.$$eval("button.bar", (bs) => bs.map((b) => b.getAttribute("aria-label")));
  const busy = await member.page.$$eval(".bar.busy", (bs) => bs.length);
  check(busy > 0, "other projects' leases show as busy");
  check(named.every((l) => !l.includes("(project ")), `other projects named: ${named.filter((l) => l.includes("(project "))}`);
  const html = await member.page.content();
  for (const other of ["proj-b", "proj-c", "proj-d", "proj-e"]) check(!html.includes(other), `${other} appears in the page`);
  const timeline = await api(tokensUrl, "GET", "/v1/os-hosts/timeline?limit=50", null, memberToken);
  const leaked = timeline.body.timeline.resources.flatMap((r) => r.busy).filter((b) => !b.own && b.lease_name);
  check(leaked.length === 0, "the API names no other project's lease to a member");
  await shot(member.page, "member-view");
  await member.page.check("#mine");
  await member.page.waitForTimeout(300);
  const mineOnly = await member.page.$$eval(".bar.busy", (bs) => bs.length);
  check(mineOnly === 0, "my leases only hides the others");
  await shot(member.page, "member-mine-only");
  await member.page.uncheck("#mine");

  step = "a member groups rows by a property";
  // The values come from the timeline's own property listing, which members may read.
  const options = await member.page.$$eval("#group-by option", (os) => os.map((o) => o.value));
  check(options.includes("node_type"), `group-by options for a member: ${options}`);
  await applyFilters(member.page, { group: "node_type" });
  const memberGroups = await member.page.$$eval(".row.group .label", (ns) => ns.map((n) => n.textContent));
  check(memberGroups.some((g) => g.startsWith("node_type = ")), `member groups: ${memberGroups}`);
  await shot(member.page, "member-grouped");
  await axe(member.page, "member");
  await member.context.close();
} catch (error) {
  failures.push(`${step}: ${error.stack || error}`);
  console.error(`FAILED ${step}:`, error);
} finally {
  await browser.close();
  metrics.failures = failures;
  metrics.duration_s = (Date.now() - t0) / 1000;
  writeFileSync(`${artifacts}/metrics.json`, JSON.stringify(metrics, null, 2));
}

log(`done: ${failures.length ? `${failures.length} failure(s)` : "all checks passed"}; metrics in ${artifacts}/metrics.json`);
process.exit(failures.length ? 1 : 0);
