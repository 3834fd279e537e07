"""Fills a freshly bootstrapped Keystone for the test cloud, through its REST API.

Creates project service and the service users (placement, nova, neutron, glance, blazar:
admin and service roles there), the catalog (placement, image, compute, network), and two
user projects, alpha and beta, each with a member user. Prints shell assignments.
Standard library only.

Usage: python setup.py KEYSTONE_V3_URL ADMIN_PASSWORD SERVICE_PASSWORD USER_PASSWORD \
    PLACEMENT_URL GLANCE_URL NOVA_URL NEUTRON_URL
"""

import json
import sys
import urllib.error
import urllib.request

url, admin_pw, service_pw, user_pw = sys.argv[1:5]
endpoints = dict(zip(["placement", "image", "compute", "network"], sys.argv[5:9]))
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
        "name": "admin", "domain": {"id": "default"}, "password": admin_pw}}},
    "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}})
token = headers["X-Subject-Token"]


def role_id(name):
    _, found = call("GET", f"/roles?name={name}")
    if found["roles"]:
        return found["roles"][0]["id"]
    return call("POST", "/roles", {"role": {"name": name}})[1]["role"]["id"]


def project(name):
    _, found = call("GET", f"/projects?name={name}")
    if found["projects"]:
        return found["projects"][0]["id"]
    return call("POST", "/projects", {"project": {"name": name, "domain_id": "default"}})[1][
        "project"]["id"]


def user(name, password, project_id, roles):
    _, made = call("POST", "/users", {"user": {
        "name": name, "domain_id": "default", "password": password,
        "default_project_id": project_id}})
    uid = made["user"]["id"]
    for r in roles:
        call("PUT", f"/projects/{project_id}/users/{uid}/roles/{role_id(r)}")
    return uid


service = project("service")
users = {}
for name in ["placement", "nova", "neutron", "glance", "blazar"]:
    users[name] = user(name, service_pw, service, ["admin", "service"])
# blazar-rs acts in users' projects (server groups of instance reservations) with its own
# credentials scoped there: an inherited role on the domain gives it one in every project.
call("PUT", f"/OS-INHERIT/domains/default/users/{users['blazar']}/roles/{role_id('admin')}"
     "/inherited_to_projects")

for kind, base in endpoints.items():
    _, made = call("POST", "/services", {"service": {"type": kind, "name": {
        "placement": "placement", "image": "glance", "compute": "nova",
        "network": "neutron"}[kind]}})
    sid = made["service"]["id"]
    for interface in ["public", "internal", "admin"]:
        call("POST", "/endpoints", {"endpoint": {
            "service_id": sid, "interface": interface, "url": base,
            "region_id": "RegionOne"}})

out = {"OS_SERVICE_PROJECT_ID": service}
for p in ["alpha", "beta"]:
    pid = project(p)
    uid = user(f"{p}-member", user_pw, pid, ["member", "reader"])
    out[f"OS_{p.upper()}_PROJECT_ID"] = pid
    out[f"OS_{p.upper()}_USER_ID"] = uid
for k, v in out.items():
    print(f"{k}={v}")
