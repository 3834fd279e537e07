"""Serves Keystone's public API with waitress (pure Python; no uwsgi or Apache to build).

Usage: python serve.py HOST:PORT  (configuration from OS_KEYSTONE_CONFIG_DIR/keystone.conf)
"""

import sys

listen = sys.argv[1]
# Keystone parses the command line as its own options: give it none.
sys.argv = sys.argv[:1]

from keystone.server import wsgi  # noqa: E402
import waitress  # noqa: E402

application = wsgi.initialize_public_application()
# One request at a time. Keystone's auth-context middleware keeps the token it validated on
# the middleware object, which every thread of the process shares (`self.token` in
# keystone/server/flask/request_processing/middleware/auth_context.py): with several
# threads, a request can be authorised with another request's token. Seen here as a trust
# made from a trust-scoped token (a redelegation Keystone refuses) and a login answered
# with 500. Production Keystone runs in processes of one thread (uwsgi, mod_wsgi).
waitress.serve(application, listen=listen, threads=1, ident="keystone")
