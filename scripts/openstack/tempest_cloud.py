"""What tempest.sh puts into a cloud from up.sh for blazar-tempest-plugin's scenarios, and
takes out again when the cloud is not its own.

Usage (the admin's OS_AUTH_URL and OS_PASSWORD in the environment, from the cloud's openrc):
  python tempest_cloud.py setup RUN_DIR BLAZAR_URL
      registers blazar-rs in the catalog, enrols every nova-compute, writes RUN_DIR/tempest.conf
      and RUN_DIR/made.json (what teardown removes)
  python tempest_cloud.py teardown RUN_DIR
      removes the hosts, an empty freepool and the catalog entry that setup made
"""

import json
import os
import sys

import openstack


def admin():
    return openstack.connect(
        auth_url=os.environ["OS_AUTH_URL"], username="admin",
        password=os.environ["OS_PASSWORD"], project_name="admin",
        user_domain_name="Default", project_domain_name="Default", region_name="RegionOne")


def setup(run, url):
    conn = admin()
    svc = conn.identity.create_service(name="blazar", type="reservation")
    # Written before anything else is made, so that a failure below still has it removed.
    with open(f"{run}/made.json", "w") as f:
        json.dump({"service": svc.id, "url": url}, f)
    for interface in ["public", "internal", "admin"]:
        conn.identity.create_endpoint(service_id=svc.id, interface=interface, url=url,
                                      region_id="RegionOne")
    # The scenarios expect every compute to be Blazar's: a server booted without a
    # reservation must find no host.
    for compute in conn.compute.services(binary="nova-compute"):
        conn.session.post(f"{url}/os-hosts", json={"name": compute.host}).raise_for_status()
    image = next(conn.image.images(name="cirros-fake"))
    flavor = conn.compute.find_flavor("m1.tiny")
    with open(f"{run}/tempest.conf", "w") as f:
        f.write(f"""[DEFAULT]
log_dir = {run}/log
log_file = tempest.log
[auth]
admin_username = admin
admin_password = {os.environ["OS_PASSWORD"]}
admin_project_name = admin
admin_domain_name = Default
use_dynamic_credentials = True
create_isolated_networks = False
[identity]
uri_v3 = {os.environ["OS_AUTH_URL"]}
auth_version = v3
region = RegionOne
[identity-feature-enabled]
api_v2 = False
[compute]
image_ref = {image.id}
flavor_ref = {flavor.id}
build_timeout = 120
[validation]
run_validation = False
[service_available]
blazar = True
nova = True
neutron = True
glance = True
cinder = False
swift = False
placement = True
[resource_reservation]
lease_interval = 2
lease_end_timeout = 300
""")


def teardown(run):
    try:
        with open(f"{run}/made.json") as f:
            made = json.load(f)
    except FileNotFoundError:
        return
    conn = admin()
    url = made["url"]
    # Best effort, each step on its own: one refusal must not keep the others from running.
    try:
        for host in conn.session.get(f"{url}/os-hosts").json()["hosts"]:
            conn.session.delete(f"{url}/os-hosts/{host['id']}")
    except Exception as e:  # noqa: BLE001
        print(f"tempest_cloud: hosts not removed: {e}", file=sys.stderr)
    try:
        freepool = conn.compute.find_aggregate("freepool")
        if freepool is not None and not freepool.hosts:
            conn.compute.delete_aggregate(freepool)
    except Exception as e:  # noqa: BLE001
        print(f"tempest_cloud: freepool not removed: {e}", file=sys.stderr)
    conn.identity.delete_service(made["service"])


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "setup":
        setup(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "teardown":
        teardown(sys.argv[2])
    else:
        sys.exit(__doc__)
