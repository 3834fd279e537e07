"""Waits for the fake computes' services, maps them into the cell, waits for their
hypervisors, then adds what the tests boot with: an image, a flavor and an external network.
Usage: python finish.py STATE_DIR COMPUTES (reads STATE_DIR/openrc and STATE_DIR/etc/nova)."""

import io
import os
import subprocess
import sys
import time

import openstack

state, computes = sys.argv[1], int(sys.argv[2])
env = {}
with open(f"{state}/openrc") as f:
    for line in f:
        key, _, value = line.removeprefix("export ").strip().partition("=")
        env[key] = value

conn = openstack.connect(
    auth_url=env["OS_AUTH_URL"], username=env["OS_USERNAME"], password=env["OS_PASSWORD"],
    project_name=env["OS_PROJECT_NAME"], user_domain_name="Default",
    project_domain_name="Default", region_name="RegionOne", compute_api_version="2.61")

deadline = time.time() + 180
while True:
    up = [s for s in conn.compute.services(binary="nova-compute") if s.state == "up"]
    if len(up) >= computes:
        break
    if time.time() > deadline:
        sys.exit(f"only {len(up)} of {computes} compute services up after 180 s")
    time.sleep(1)
# The API lists hypervisors of mapped hosts only, and a compute's node record comes a few
# seconds after its service: map again until every one is there.
while True:
    subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "nova-manage"), "--config-file",
         f"{state}/etc/nova/nova.conf", "cell_v2", "discover_hosts"], check=True)
    found = list(conn.compute.hypervisors())
    if len(found) >= computes:
        break
    if time.time() > deadline:
        sys.exit(f"only {len(found)} of {computes} hypervisors after 180 s")
    time.sleep(2)
print("hypervisors:", sorted(h.name for h in found))

image = conn.image.create_image(
    name="cirros-fake", disk_format="raw", container_format="bare", visibility="public",
    data=io.BytesIO(b"\0" * 1024))
print("image:", image.id)
flavor = conn.compute.create_flavor(name="m1.tiny", ram=64, vcpus=1, disk=1)
print("flavor:", flavor.id)
net = conn.network.create_network(
    name="public", is_router_external=True, provider_network_type="flat",
    provider_physical_network="public")
conn.network.create_subnet(
    network_id=net.id, name="public-subnet", ip_version=4, cidr="172.24.4.0/24",
    allocation_pools=[{"start": "172.24.4.10", "end": "172.24.4.200"}], enable_dhcp=False)
print("network:", net.id)
