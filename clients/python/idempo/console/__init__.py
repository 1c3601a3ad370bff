"""idempo console: the web page for the people who decide (docs/console.md).

    python3 -m idempo.console --dsn 'host=/run/postgresql dbname=shop' --listen 127.0.0.1:8040

Each person signs in with their own PostgreSQL role and password; every page and every
decision runs on a connection made as that role, so PostgreSQL's grants decide what they may
do, and idempo records them as the reviewer. Behind a single sign-on proxy
(--sso-header), the console connects as a role of its own and SETs ROLE to the person the proxy
names.  Needs Starlette, uvicorn, Jinja2 and psycopg 3
(Debian: python3-starlette python3-uvicorn python3-jinja2 python3-psycopg).
"""
from .app import Settings, create_app

__all__ = ['Settings', 'create_app']
