"""Serves one OpenStack WSGI application under gunicorn (threads, one worker; Keystone: two
workers of one thread).

Usage: python serve.py MODULE HOST:PORT NAME
MODULE is the application's WSGI module (keystone.wsgi.api, placement.wsgi.api, ...); its
configuration comes from the OS_*_CONFIG_DIR variables the caller sets.
"""

import sys

from gunicorn.app.base import BaseApplication

module, listen, name = sys.argv[1:4]


# Keystone's auth-context middleware keeps the token it validated on the middleware object,
# which every thread of a process shares: with several threads, a request can be authorised
# with another request's token. Keystone gets processes of one thread instead.
one_thread = module.startswith("keystone.")


class App(BaseApplication):
    def load_config(self):
        self.cfg.set("bind", listen)
        self.cfg.set("workers", 2 if one_thread else 1)
        self.cfg.set("worker_class", "sync" if one_thread else "gthread")
        self.cfg.set("threads", 1 if one_thread else 8)
        self.cfg.set("timeout", 120)
        self.cfg.set("proc_name", name)
        self.cfg.set("accesslog", None)
        # One control socket per user by default: several servers would fight over it.
        self.cfg.set("control_socket_disable", True)

    def load(self):
        # oslo.config reads the process's command line as its own options: give it none.
        sys.argv = [name]
        app = __import__(module, fromlist=["application"])
        return app.application


App().run()
