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
waitress.serve(application, listen=listen, threads=8, ident="keystone")
