// The side panel (a lease's details, booking, finding a slot, extending) and the sign-in
// dialog. Every change goes through the v1 API; every refusal shows the server's message
// and its reasons.

import { api, reasonLines, session, ApiError } from "./api.js";
import { escapeHtml, statusClass } from "./gantt.js";
import { HOUR, MINUTE, DAY, formatDuration, parseApi, toApi } from "./time.js";

const $ = (id) => document.getElementById(id);

export class Panels {
  constructor(context) {
    this.context = context;
    this.offers = [];
    this.offerRequest = null;
    this.current = null;
    $("panel-close").addEventListener("click", () => this.close());
    $("panel").addEventListener("keydown", (e) => { if (e.key === "Escape") this.close(); });
    this.wireSignIn();
  }

  get zone() {
    return this.context.zone();
  }

  date(text) {
    return this.zone.formatDateTime(parseApi(text));
  }

  open(title, html, focus = true) {
    $("panel-title").textContent = title;
    $("panel-body").innerHTML = html;
    $("panel").hidden = false;
    if (focus) $("panel-title").setAttribute("tabindex", "-1"), $("panel-title").focus();
  }

  close() {
    $("panel").hidden = true;
    this.current = null;
    this.context.showOffers([]);
  }

  /** Redraws the open panel (after the time zone changed). */
  refresh() {
    if (this.current) this.current();
  }

  /** The server's explanation of a refusal, as markup. */
  refusal(error) {
    const lines = error instanceof ApiError ? reasonLines(error, (t) => this.date(t)) : [];
    return `<div class="refusal" role="alert"><strong>${escapeHtml(error.message)}</strong>${
      lines.length ? `<ul>${lines.map((l) => `<li>${escapeHtml(l)}</li>`).join("")}</ul>` : ""}</div>`;
  }

  async showLease(id) {
    this.current = () => this.showLease(id);
    this.open("Lease", "<p>Loading…</p>");
    let lease;
    try {
      lease = (await api("GET", `v1/leases/${encodeURIComponent(id)}`)).lease;
    } catch (error) {
      this.open("Lease", this.refusal(error));
      return;
    }
    const allocations = await this.allocations(lease);
    const reservations = (lease.reservations || []).map((r) => {
      const facts = ["min", "max", "amount", "resource_properties", "network_id", "status"]
        .filter((k) => r[k] !== undefined && r[k] !== null && r[k] !== "")
        .map((k) => `${k}: ${typeof r[k] === "string" ? r[k] : JSON.stringify(r[k])}`);
      if (r.missing_resources) facts.push("missing resources");
      return `<li><strong>${escapeHtml(r.resource_type)}</strong> ${escapeHtml(facts.join(", "))}</li>`;
    }).join("");
    const extendable = ["PENDING", "ACTIVE"].includes(lease.status);
    const endInput = this.zone.toInput(parseApi(lease.end_date) + HOUR);
    this.open(`Lease ${lease.name}`, `
      <dl>
        <dt>Status</dt><dd><span class="swatch ${statusClass(lease.status)}"></span> ${escapeHtml(lease.status)}${lease.degraded ? " (degraded: some resources are missing)" : ""}</dd>
        <dt>Start</dt><dd>${escapeHtml(this.date(lease.start_date))}</dd>
        <dt>End</dt><dd>${escapeHtml(this.date(lease.end_date))}</dd>
        <dt>Length</dt><dd>${escapeHtml(formatDuration(parseApi(lease.end_date) - parseApi(lease.start_date)))}</dd>
        <dt>Project</dt><dd>${escapeHtml(lease.project_id)}</dd>
        <dt>Id</dt><dd>${escapeHtml(lease.id)}</dd>
      </dl>
      <h3>Reservations</h3><ul>${reservations}</ul>
      <h3>Allocations</h3>${allocations}
      ${extendable ? `
      <h3>Extend</h3>
      <form id="extend-form">
        <label>New end (${escapeHtml(this.zone.name)}) <input type="datetime-local" name="end" value="${endInput}" required></label>
        <button type="submit" class="primary">Check and extend</button>
      </form>` : ""}
      <div id="lease-result" aria-live="polite"></div>
      <p><button type="button" id="delete-lease">Delete lease</button></p>`);
    $("extend-form")?.addEventListener("submit", (e) => {
      e.preventDefault();
      const end = this.zone.parseInput(new FormData(e.target).get("end"));
      this.extend(lease.id, parseApi(lease.end_date), end);
    });
    $("delete-lease").addEventListener("click", async () => {
      if (!confirm(`Delete lease ${lease.name}?`)) return;
      try {
        await api("DELETE", `v1/leases/${encodeURIComponent(lease.id)}`);
        this.close();
        this.context.changed();
      } catch (error) {
        $("lease-result").innerHTML = this.refusal(error);
      }
    });
  }

  /** The resources a lease holds, per type it reserves. */
  async allocations(lease) {
    const kinds = new Set((lease.reservations || []).map((r) => r.resource_type));
    const parts = [];
    const lists = [
      ["physical:host", "hosts", (h) => h.hypervisor_hostname || h.name || h.id],
      ["network", "networks", (n) => `${n.physical_network || ""}:${n.segment_id || n.id}`],
      ["device", "devices", (d) => d.name || d.id],
    ];
    for (const [kind, path, name] of lists) {
      if (!kinds.has(kind)) continue;
      try {
        const answer = await api("GET", `v1/leases/${encodeURIComponent(lease.id)}/${path}`);
        const items = answer[path] || [];
        parts.push(`<p>${items.length} ${path}: ${items.map((i) => escapeHtml(name(i))).join(", ")}</p>`);
      } catch (error) {
        parts.push(this.refusal(error));
      }
    }
    return parts.join("") || "<p>Shown with each reservation.</p>";
  }

  /** Checks an extension with the server first, then updates the lease if it is possible. */
  async extend(id, currentEnd, newEnd) {
    if (!(newEnd > currentEnd)) {
      this.open("Extend lease", `<p class="refusal">The new end must be after the current end (${escapeHtml(this.zone.formatDateTime(currentEnd))}).</p>`);
      return;
    }
    const target = toApi(newEnd);
    let check;
    try {
      check = (await api("GET", `v1/leases/${encodeURIComponent(id)}/extension?end_date=${encodeURIComponent(target)}`)).extension;
    } catch (error) {
      this.open("Extend lease", this.refusal(error));
      return;
    }
    if (check.possible === false) {
      const latest = check.latest_end_date ? `The latest end it can reach is ${escapeHtml(this.date(check.latest_end_date))}.` : "It cannot be extended at all now.";
      this.open("Extend lease", `<div class="refusal" role="alert"><strong>${escapeHtml(check.reason || "Not possible")}</strong><p>${latest}</p></div>`);
      return;
    }
    try {
      await api("PUT", `v1/leases/${encodeURIComponent(id)}`, { end_date: target });
    } catch (error) {
      this.open("Extend lease", this.refusal(error));
      return;
    }
    await this.showLease(id);
    $("lease-result")?.insertAdjacentHTML("afterbegin", `<p class="ok" role="status">Extended to ${escapeHtml(this.zone.formatDateTime(newEnd))}.</p>`);
    this.context.changed();
  }

  /** The reservation a booking or an offer search asks for. */
  reservationFor(type, count, query, name, fip = {}) {
    switch (type) {
      case "hosts":
        return [{ resource_type: "physical:host", min: count, max: count, hypervisor_properties: "", resource_properties: query }];
      case "devices":
        return [{ resource_type: "device", min: count, max: count, resource_properties: query }];
      case "networks":
        return Array.from({ length: count }, (_, k) => ({
          resource_type: "network", network_name: `${name}-${k + 1}`, resource_properties: query,
        }));
      default: {
        const r = { resource_type: "virtual:floatingip", network_id: fip.networkId || "", amount: count };
        if (fip.addresses?.length) r.required_floatingips = fip.addresses;
        return [r];
      }
    }
  }

  /** A query naming exactly these resources. */
  static namedQuery(type, resources) {
    const key = type === "hosts" ? "$hypervisor_hostname" : "$id";
    const conditions = resources.map((r) => ["==", key, type === "hosts" ? r.name : r.id]);
    if (!conditions.length) return "";
    return JSON.stringify(conditions.length === 1 ? conditions[0] : ["or", ...conditions]);
  }

  async showBooking({ type, resources, start, end }) {
    const types = this.context.types;
    let networkId = "";
    if (type === "floatingips" && resources.length) {
      try {
        networkId = (await api("GET", `v1/floatingips/${encodeURIComponent(resources[0].id)}`)).floatingip.floating_network_id || "";
      } catch {
        networkId = "";
      }
    }
    const query = type === "floatingips" ? "" : Panels.namedQuery(type, resources);
    const count = Math.max(1, resources.length);
    const named = resources.map((r) => r.name).join(", ");
    this.current = null;
    this.open("Book", `
      <form id="book-form">
        <p>${resources.length ? `${escapeHtml(types[type].label)}: ${escapeHtml(named)}` : `Any ${escapeHtml(types[type].noun)} matching the properties.`}</p>
        <label>Lease name <input name="name" required value="lease-${new Date().toISOString().slice(5, 16).replace(/[-:T]/g, "")}"></label>
        <label>How many <input name="count" type="number" min="1" value="${count}" required></label>
        <label>Properties <input name="query" value="${escapeHtml(query)}" spellcheck="false"></label>
        ${type === "floatingips" ? `<label>External network id <input name="network" value="${escapeHtml(networkId)}" required></label>` : ""}
        <label>Start (${escapeHtml(this.zone.name)}) <input name="start" type="datetime-local" value="${this.zone.toInput(start)}" required></label>
        <label>End (${escapeHtml(this.zone.name)}) <input name="end" type="datetime-local" value="${this.zone.toInput(end)}" required></label>
        <p><button type="submit" class="primary">Book</button> <button type="button" id="book-check">Check only</button></p>
      </form>
      <div id="book-result" aria-live="polite"></div>`);
    const form = $("book-form");
    const body = () => {
      const f = new FormData(form);
      const name = f.get("name");
      const addresses = type === "floatingips" ? resources.map((r) => r.name) : [];
      return {
        name,
        start_date: toApi(this.zone.parseInput(f.get("start"))),
        end_date: toApi(this.zone.parseInput(f.get("end"))),
        events: [],
        reservations: this.reservationFor(type, Number(f.get("count")), f.get("query") || "", name,
          { networkId: f.get("network"), addresses }),
      };
    };
    $("book-check").addEventListener("click", async () => {
      try {
        const answer = await api("POST", "v1/leases?dry_run=true", body());
        $("book-result").innerHTML = `<p class="ok" role="status">It would be granted (${escapeHtml(answer.lease.status || "ok")}); nothing was booked.</p>`;
      } catch (error) {
        $("book-result").innerHTML = this.refusal(error);
      }
    });
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      await this.create(body(), $("book-result"));
    });
  }

  async create(body, resultNode) {
    try {
      const lease = (await api("POST", "v1/leases", body)).lease;
      this.context.showOffers([]);
      this.context.changed();
      await this.showLease(lease.id);
      $("lease-result")?.insertAdjacentHTML("afterbegin", `<p class="ok" role="status">Booked lease ${escapeHtml(lease.name)}.</p>`);
    } catch (error) {
      resultNode.innerHTML = this.refusal(error);
    }
  }

  showFindSlot() {
    const type = this.context.type();
    const types = this.context.types;
    this.current = null;
    this.open("Find a slot", `
      <form id="slot-form">
        <label>Resource type <select name="type">${Object.entries(types).map(([k, t]) => `<option value="${k}"${k === type ? " selected" : ""}>${escapeHtml(t.label)}</option>`).join("")}</select></label>
        <label>How many <input name="count" type="number" min="1" value="1" required></label>
        <label>Properties <input name="query" spellcheck="false" placeholder='["==", "$node_type", "compute"]'></label>
        <label>External network id (floating IPs) <input name="network"></label>
        <label>Duration in hours <input name="hours" type="number" min="0.25" step="0.25" value="4" required></label>
        <label>Within the next days <input name="days" type="number" min="1" max="366" value="7" required></label>
        <label>Lease name <input name="name" value="slot"></label>
        <p><button type="submit" class="primary">Find</button></p>
      </form>
      <div id="slot-result" aria-live="polite"></div>`);
    $("slot-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.findSlots(new FormData(e.target));
    });
  }

  async findSlots(form) {
    const type = form.get("type");
    const count = Number(form.get("count"));
    const name = form.get("name") || "slot";
    const reservations = this.reservationFor(type, count, form.get("query") || "", name, { networkId: form.get("network") });
    const now = Date.now();
    const request = {
      reservations,
      duration: Math.round(Number(form.get("hours")) * 60),
      not_before: toApi(Math.ceil((now + MINUTE) / MINUTE) * MINUTE),
      not_after: toApi(now + Number(form.get("days")) * DAY),
      limit: 5,
    };
    const result = $("slot-result");
    result.innerHTML = "<p>Searching…</p>";
    try {
      this.offers = (await api("POST", "v1/leases/offers", request)).offers || [];
    } catch (error) {
      result.innerHTML = this.refusal(error);
      return;
    }
    this.offerRequest = { name, reservations };
    if (!this.offers.length) {
      result.innerHTML = `<p class="refusal" role="alert">No window of ${escapeHtml(formatDuration(request.duration * MINUTE))} fits before ${escapeHtml(this.zone.formatDateTime(now + Number(form.get("days")) * DAY))}.</p>`;
      this.context.showOffers([]);
      return;
    }
    result.innerHTML = `<p>${this.offers.length} offer(s), drawn on the chart; click one there or here to book it.</p><ol class="offers">${this.offers.map((o, i) => `
      <li>${escapeHtml(this.date(o.start_date))} to ${escapeHtml(this.date(o.end_date))}:
      ${escapeHtml(o.reservations.flatMap((r) => r.resources.map((x) => x.name)).join(", "))}
      <button type="button" data-book-offer="${i}">Book offer ${i + 1}</button></li>`).join("")}</ol>`;
    result.querySelectorAll("[data-book-offer]").forEach((b) =>
      b.addEventListener("click", () => this.bookOffer(Number(b.dataset.bookOffer))));
    this.context.showOffers(this.offers);
  }

  /** Books an offer as found: a plain create of its dates and the same reservations. */
  async bookOffer(index) {
    const offer = this.offers[index];
    if (!offer || !this.offerRequest) return;
    const result = $("slot-result") || $("panel-body");
    await this.create({
      name: this.offerRequest.name,
      start_date: toApi(parseApi(offer.start_date)),
      end_date: toApi(parseApi(offer.end_date)),
      events: [],
      reservations: this.offerRequest.reservations,
    }, result);
  }

  wireSignIn() {
    const dialog = $("sign-in");
    const form = $("sign-in-form");
    $("keystone-fields").hidden = this.context.authMode !== "keystone";
    $("sign-in-cancel").addEventListener("click", () => dialog.close());
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const f = new FormData(form);
      const token = (f.get("token") || "").trim();
      $("sign-in-error").textContent = "";
      try {
        if (token) {
          session.set(token, { user: { name: "token" } });
          // The token is checked by using it: a list the caller may always see.
          await api("GET", "v1/leases");
        } else if (this.context.authMode === "keystone") {
          const answer = await api("POST", "calendar/api/sign-in", {
            username: f.get("username"), password: f.get("password"),
            project: f.get("project"), domain: f.get("domain"),
          });
          session.set(answer.token, { user: answer.user, project: answer.project });
        } else {
          throw new Error("Paste a token to sign in.");
        }
      } catch (error) {
        session.clear();
        $("sign-in-error").textContent = error.status === 401 ? "The server did not accept this token or these credentials." : error.message;
        return;
      }
      form.reset();
      dialog.close();
      window.dispatchEvent(new Event("calendar-signed-in"));
    });
  }

  askSignIn(message = "") {
    $("sign-in-error").textContent = message;
    const dialog = $("sign-in");
    if (!dialog.open) dialog.showModal();
  }
}
