// Seeds a blazar-server (noauth) through the v1 API for the calendar's browser test: HOSTS
// hosts in racks of ten with a node_type, one lease per rack slot (each lease takes a whole
// rack, so allocations = leases x 10) spread over the next four weeks, in five projects, a
// few leases starting now (ACTIVE), and a handful of floating IPs, segments and devices.
//
// Usage: node seed.mjs URL [HOSTS] [ALLOCATIONS]

const [url, hostsArg = "1000", allocationsArg = "10000"] = process.argv.slice(2);
const HOSTS = Number(hostsArg);
const RACK = 10;
const RACKS = Math.ceil(HOSTS / RACK);
const LEASES = Math.ceil(Number(allocationsArg) / RACK);
const PER_RACK = Math.ceil(LEASES / RACKS);
const PROJECTS = ["proj-a", "proj-b", "proj-c", "proj-d", "proj-e"];
const NODE_TYPES = ["compute_skylake", "compute_cascadelake", "gpu_rtx6000", "storage_hdd"];
const HOUR = 3_600_000;
const CONCURRENCY = 8;

async function call(method, path, body, project) {
  const headers = { "Content-Type": "application/json" };
  if (project) headers["X-Project-Id"] = project;
  const response = await fetch(`${url}${path}`, { method, headers, body: body && JSON.stringify(body) });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text.slice(0, 300)}`);
  return text ? JSON.parse(text) : null;
}

async function pool(items, work) {
  let next = 0;
  const failures = [];
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (next < items.length) {
      const item = items[next++];
      try {
        await work(item);
      } catch (error) {
        failures.push(error.message);
      }
    }
  }));
  return failures;
}

const apiDate = (ms) => new Date(ms).toISOString().slice(0, 16).replace("T", " ");
const pad = (n, w) => String(n).padStart(w, "0");

const t0 = Date.now();
const hosts = Array.from({ length: HOSTS }, (_, i) => i);
let failures = await pool(hosts, (i) => {
  const rack = Math.floor(i / RACK);
  return call("POST", "/v1/os-hosts", {
    name: `node-${pad(i + 1, 5)}`,
    vcpus: 48, memory_mb: 196608, local_gb: 960,
    node_type: NODE_TYPES[rack % NODE_TYPES.length],
    rack: `rack-${pad(rack + 1, 3)}`,
  });
});
if (failures.length) throw new Error(`hosts: ${failures.length} failed, first: ${failures[0]}`);
console.log(`seed: ${HOSTS} hosts in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

// Slots of a rack follow each other over four weeks from the next full hour; a lease fills
// 40 to 90 % of its slot. Every seventh rack's first lease starts now, so some are ACTIVE.
const start0 = Math.ceil((Date.now() + 2 * 60_000) / HOUR) * HOUR;
const slot = Math.floor((28 * 24) / PER_RACK) * HOUR;
const leases = [];
for (let rack = 0; rack < RACKS; rack++) {
  for (let k = 0; k < PER_RACK && leases.length < LEASES; k++) {
    const fill = 0.4 + ((rack * 7 + k * 13) % 11) / 20;
    const now = k === 0 && rack % 7 === 0;
    const start = start0 + k * slot + (now ? 0 : HOUR * ((rack + k) % 5));
    const end = start0 + k * slot + Math.max(2 * HOUR, Math.floor((slot * fill) / HOUR) * HOUR);
    leases.push({
      project: PROJECTS[(rack + k) % PROJECTS.length],
      body: {
        name: `exp-${pad(rack + 1, 3)}-${k + 1}`,
        start_date: now ? "now" : apiDate(start),
        end_date: apiDate(end),
        events: [],
        reservations: [{
          resource_type: "physical:host", min: RACK, max: RACK, hypervisor_properties: "",
          resource_properties: JSON.stringify(["==", "$rack", `rack-${pad(rack + 1, 3)}`]),
        }],
      },
    });
  }
}
const t1 = Date.now();
failures = await pool(leases, (l) => call("POST", "/v1/leases", l.body, l.project));
if (failures.length > leases.length / 100) throw new Error(`leases: ${failures.length} failed, first: ${failures[0]}`);
console.log(`seed: ${leases.length - failures.length} leases (${(leases.length - failures.length) * RACK} allocations) in ${((Date.now() - t1) / 1000).toFixed(1)} s`);

for (let i = 1; i <= 12; i++) {
  await call("POST", "/v1/floatingips", { floating_network_id: "ext-net", floating_ip_address: `203.0.113.${i}` });
  await call("POST", "/v1/devices", { name: `gpu-${pad(i, 2)}`, device_type: "gpu", device_driver: "k8s", model: i % 2 ? "a100" : "rtx6000" });
  await call("POST", "/v1/networks", { network_type: "vlan", physical_network: "physnet1", segment_id: 3000 + i });
}
await call("POST", "/v1/leases", {
  name: "gpu-training", start_date: apiDate(start0 + 24 * HOUR), end_date: apiDate(start0 + 72 * HOUR), events: [],
  reservations: [{ resource_type: "device", min: 2, max: 2, resource_properties: JSON.stringify(["==", "$model", "a100"]) }],
}, "proj-a");
await call("POST", "/v1/leases", {
  name: "public-ips", start_date: apiDate(start0 + 6 * HOUR), end_date: apiDate(start0 + 30 * HOUR), events: [],
  reservations: [{ resource_type: "virtual:floatingip", network_id: "ext-net", amount: 3 }],
}, "proj-b");
console.log(`seed: done in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
