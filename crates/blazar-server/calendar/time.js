// Time as the calendar needs it: the API's UTC dates in and out, and days and labels in the
// zone the user chose (the browser's own, or UTC).

export const MINUTE = 60_000;
export const HOUR = 60 * MINUTE;
export const DAY = 24 * HOUR;

/** "2030-01-01T10:00:00.000000" (UTC, as the API writes dates) as epoch milliseconds. */
export function parseApi(text) {
  if (!text) return NaN;
  return Date.parse(text.slice(0, 19).replace(" ", "T") + "Z");
}

/** Epoch milliseconds as "2030-01-01 10:00", the form lease requests take (UTC). */
export function toApi(ms) {
  return new Date(ms).toISOString().slice(0, 16).replace("T", " ");
}

export function roundToMinute(ms) {
  return Math.round(ms / MINUTE) * MINUTE;
}

export class Zone {
  constructor(utc) {
    this.utc = utc;
    const timeZone = utc ? "UTC" : undefined;
    this.name = utc ? "UTC" : Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";
    this.dateTime = new Intl.DateTimeFormat(undefined, {
      timeZone, year: "numeric", month: "short", day: "numeric", hour: "2-digit",
      minute: "2-digit", hourCycle: "h23",
    });
    this.day = new Intl.DateTimeFormat(undefined, {
      timeZone, weekday: "short", month: "short", day: "numeric",
    });
    this.hour = new Intl.DateTimeFormat(undefined, {
      timeZone, hour: "2-digit", minute: "2-digit", hourCycle: "h23",
    });
    this.month = new Intl.DateTimeFormat(undefined, { timeZone, year: "numeric", month: "long" });
  }

  /** Midnight of the day `ms` falls in. */
  startOfDay(ms) {
    const d = new Date(ms);
    if (this.utc) d.setUTCHours(0, 0, 0, 0);
    else d.setHours(0, 0, 0, 0);
    return d.getTime();
  }

  /** The midnight `days` days after the one of `ms` (days are not always 24 h long). */
  addDays(ms, days) {
    const d = new Date(this.startOfDay(ms));
    if (this.utc) d.setUTCDate(d.getUTCDate() + days);
    else d.setDate(d.getDate() + days);
    return d.getTime();
  }

  /** Epoch milliseconds of a `<input type="datetime-local">` value read in this zone. */
  parseInput(value) {
    if (!value) return NaN;
    return this.utc ? Date.parse(value + "Z") : new Date(value).getTime();
  }

  /** Epoch milliseconds as a `<input type="datetime-local">` value in this zone. */
  toInput(ms) {
    const d = new Date(ms);
    const shifted = this.utc ? d : new Date(ms - d.getTimezoneOffset() * MINUTE);
    return shifted.toISOString().slice(0, 16);
  }

  formatDateTime(ms) {
    return this.dateTime.format(ms);
  }
}

/** "3 d 4 h", "45 min": a duration for people. */
export function formatDuration(ms) {
  const minutes = Math.round(ms / MINUTE);
  const d = Math.floor(minutes / 1440);
  const h = Math.floor((minutes % 1440) / 60);
  const m = minutes % 60;
  const parts = [];
  if (d) parts.push(`${d} d`);
  if (h) parts.push(`${h} h`);
  if (m || !parts.length) parts.push(`${m} min`);
  return parts.join(" ");
}
