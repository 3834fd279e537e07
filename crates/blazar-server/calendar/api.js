// The v1 API as the page calls it: the same requests the CLI sends, with the tab's token.
// The token lives in sessionStorage only (gone when the tab closes), never in a URL or a
// cookie, so no other tab, link or script-readable cookie carries it.

const TOKEN_KEY = "blazar-calendar-token";
const WHO_KEY = "blazar-calendar-who";

export const session = {
  get token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  get who() {
    try {
      return JSON.parse(sessionStorage.getItem(WHO_KEY) || "null");
    } catch {
      return null;
    }
  },
  set(token, who) {
    sessionStorage.setItem(TOKEN_KEY, token);
    sessionStorage.setItem(WHO_KEY, JSON.stringify(who || null));
  },
  clear() {
    sessionStorage.removeItem(TOKEN_KEY);
    sessionStorage.removeItem(WHO_KEY);
  },
};

/** A refused call: the server's message and, for lease refusals, its reasons. */
export class ApiError extends Error {
  constructor(status, body) {
    const message =
      body?.error_message ?? body?.error?.message ?? (typeof body === "string" ? body : null) ??
      `The server answered ${status}`;
    super(message);
    this.status = status;
    this.body = body;
    this.reasons = Array.isArray(body?.reasons) ? body.reasons : [];
  }
}

/** Bytes received from the API since the page loaded (what a screen costs to show). */
export const traffic = { bytes: 0, requests: 0 };

/** Calls `method path` (relative to the server root) and answers the parsed body. */
export async function api(method, path, body, { signal } = {}) {
  const headers = { Accept: "application/json" };
  if (session.token) headers["X-Auth-Token"] = session.token;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    credentials: "omit",
    cache: "no-store",
  });
  const text = await response.text();
  traffic.bytes += text.length;
  traffic.requests += 1;
  let parsed = null;
  try {
    parsed = text ? JSON.parse(text) : null;
  } catch {
    parsed = text;
  }
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

/** One line per reason of a refusal, as the CLI prints them. */
export function reasonLines(error, formatDate) {
  const lines = [];
  for (const r of error.reasons || []) {
    const parts = [];
    if (r.reservation !== undefined) parts.push(`reservation ${r.reservation}`);
    if (r.resource_type) parts.push(`(${r.resource_type})`);
    if (r.requested) {
      const q = r.requested;
      const asked = [];
      if (q.min !== undefined) asked.push(`min ${q.min}`);
      if (q.max !== undefined) asked.push(`max ${q.max}`);
      if (q.amount !== undefined) asked.push(`amount ${q.amount}`);
      if (asked.length) parts.push(`requested ${asked.join(", ")}`);
    }
    if (r.matching !== undefined) parts.push(`${r.matching} matching`);
    if (r.free !== undefined) {
      const window = r.start_date && r.end_date
        ? ` from ${formatDate(r.start_date)} to ${formatDate(r.end_date)}` : "";
      parts.push(`${r.free} free${window}`);
    }
    if (r.rule) parts.push(`policy rule ${r.rule}`);
    if (r.field) parts.push(`field ${r.field}`);
    if (r.filter) parts.push(`refused by ${r.filter}`);
    if (r.next_offer) {
      parts.push(`next possible window: ${formatDate(r.next_offer.start_date)} to ${formatDate(r.next_offer.end_date)}`);
    } else if (r.next_offer === null) {
      parts.push("no later window found");
    }
    lines.push(parts.join("; "));
  }
  return lines;
}
