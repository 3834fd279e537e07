"""Creates the test cloud in a freshly bootstrapped Keystone, through its REST API.

Projects alpha and beta, each with users <project>-admin, -member and -reader holding that
role; project service with user blazar holding the service role (enough to validate tokens)
and admin (to delete the trusts of deleted leases).
Prints shell assignments for the Rust tests. Standard library only.

Usage: python setup.py KEYSTONE_V3_URL ADMIN_PASSWORD SERVICE_PASSWORD USER_PASSWORD [BLAZAR_URL]
With BLAZAR_URL (e.g. http://127.0.0.1:1234/v1), also puts the reservation service in the
catalog, as a deployment does, so that `openstack reservation ...` finds it.
"""

import json
import sys
import urllib.error
import urllib.request

url, admin_password, service_password, user_password = sys.argv[1:5]
blazar_url = sys.argv[5] if len(sys.argv) > 5 else None
token = None


def call(method, path, body=None, expect=(200, 201, 204)):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("X-Auth-Token", token)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, headers, text = resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, e.headers, e.read()
    if status not in expect:
        sys.exit(f"setup: {method} {path} answered {status}: {text[:500]!r}")
    return headers, (json.loads(text) if text else {})


headers, _ = call("POST", "/auth/tokens", {"auth": {
    "identity": {"methods": ["password"], "password": {"user": {
        "name": "admin", "domain": {"id": "default"}, "password": admin_password}}},
    "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}})
token = headers["X-Subject-Token"]


def role_id(name):
    _, found = call("GET", f"/roles?name={name}")
    if found["roles"]:
        return found["roles"][0]["id"]
    _, made = call("POST", "/roles", {"role": {"name": name}})
    return made["role"]["id"]


def project_id(name):
    _, made = call("POST", "/projects", {"project": {"name": name, "domain_id": "default"}},
                   expect=(201, 409))
    if "project" in made:
        return made["project"]["id"]
    _, found = call("GET", f"/projects?name={name}")
    return found["projects"][0]["id"]


def user(name, password, project, role):
    # No default project: a login without a scope must give an unscoped token.
    _, made = call("POST", "/users", {"user": {
        "name": name, "domain_id": "default", "password": password}})
    uid = made["user"]["id"]
    call("PUT", f"/projects/{project}/users/{uid}/roles/{role_id(role)}")
    return uid


for project in ("alpha", "beta"):
    pid = project_id(project)
    for role in ("admin", "member", "reader"):
        user(f"{project}-{role}", user_password, pid, role)
blazar = user("blazar", service_password, project_id("service"), "service")
# Admin there too, as deployments give their service users: Keystone lets only an admin (or the
# trustor) delete a trust, and blazar-rs deletes the trusts of deleted leases (act_for_user =
# trust) with its own credentials.
call("PUT", f"/projects/{project_id('service')}/users/{blazar}/roles/{role_id('admin')}")

if blazar_url:
    _, service = call("POST", "/services", {"service": {"name": "blazar", "type": "reservation"}})
    call("POST", "/endpoints", {"endpoint": {
        "service_id": service["service"]["id"], "interface": "public", "url": blazar_url,
        "region_id": "RegionOne"}})

print("export BLAZAR_TEST_KEYSTONE_URL=" + url)
print("export BLAZAR_TEST_KEYSTONE_SERVICE_USER=blazar")
print("export BLAZAR_TEST_KEYSTONE_SERVICE_PASSWORD=" + service_password)
print("export BLAZAR_TEST_KEYSTONE_USER_PASSWORD=" + user_password)
