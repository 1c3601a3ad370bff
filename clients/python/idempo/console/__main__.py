"""python3 -m idempo.console --dsn DSN [--listen HOST:PORT] [--read-only] [--session-minutes N]
   [--sso-header NAME --sso-trust ADDR[,ADDR] --sso-group ROLE [--sso-map HOW] [--sso-domain DOMAIN]]"""
import argparse
import ipaddress
import logging
import sys

from .app import Settings, create_app


def main(argv=None):
    p = argparse.ArgumentParser(prog='python3 -m idempo.console',
                                description='The review console of idempo (docs/console.md).')
    p.add_argument('--dsn', required=True,
                   help="libpq connection string of the database, without user or password: each person signs in "
                        "as their own role (with --sso-header: with the console's own role and its password)")
    p.add_argument('--listen', default='127.0.0.1:8040', help='HOST:PORT to listen on (default 127.0.0.1:8040)')
    p.add_argument('--read-only', action='store_true', help='show, never decide')
    p.add_argument('--session-minutes', type=int, default=30,
                   help='a session ends after this many minutes without a request (default 30)')
    p.add_argument('--session-hours', type=int, default=8, help='and this many hours after sign-in (default 8)')
    p.add_argument('--https', action='store_true',
                   help='the console is served through HTTPS (a proxy): cookies are marked Secure')
    p.add_argument('--sign-in-attempts', type=int, default=10,
                   help='failed password sign-ins allowed per client address and per role name in the window, '
                        'then 429 (default 10; 0: no limit)')
    p.add_argument('--sign-in-window', type=int, default=15, help='the window, in minutes (default 15)')
    p.add_argument('--reconnect-seconds', type=float, default=60,
                   help="a person's connection, kept between their pages, is opened anew after this many "
                        'seconds (default 60): what PostgreSQL checks at a connection (the password, LOGIN, '
                        'pg_hba.conf) is checked again that often')
    p.add_argument('--sso-header', metavar='NAME',
                   help='single sign-on: the header the authenticating proxy sets to the person (no password form)')
    p.add_argument('--sso-trust', metavar='ADDR[,ADDR]',
                   help="the proxies' addresses (or networks): the header from any other peer is ignored")
    p.add_argument('--sso-group', metavar='ROLE', help="the reviewers' group role: the person's role must be a member")
    p.add_argument('--sso-map', choices=('exact', 'lower', 'local-part'), default='exact',
                   help="header value to role name: as it is (default), lower-cased, or the lower-cased local "
                        "part of an address in --sso-domain")
    p.add_argument('--sso-domain', metavar='DOMAIN', help='with --sso-map local-part: the only domain taken')
    a = p.parse_args(argv)
    host, _, port = a.listen.rpartition(':')
    if not host or not port.isdigit():
        p.error('--listen takes HOST:PORT')
    trust = ()
    if a.sso_header:
        if not a.sso_trust or not a.sso_group:
            p.error('--sso-header needs --sso-trust (the proxy) and --sso-group (the reviewers)')
        try:
            trust = tuple(ipaddress.ip_network(x.strip()) for x in a.sso_trust.split(','))
        except ValueError as e:
            p.error(f'--sso-trust: {e}')
        if a.sso_map == 'local-part' and not a.sso_domain:
            p.error('--sso-map local-part needs --sso-domain')
    elif a.sso_trust or a.sso_group or a.sso_domain:
        p.error('--sso-trust, --sso-group and --sso-domain go with --sso-header')
    settings = Settings(dsn=a.dsn, read_only=a.read_only, idle_seconds=a.session_minutes * 60,
                        max_seconds=a.session_hours * 3600, secure_cookies=a.https,
                        sso_header=a.sso_header, sso_trust=trust, sso_group=a.sso_group, sso_map=a.sso_map,
                        sso_domain=a.sso_domain, sign_in_attempts=a.sign_in_attempts,
                        sign_in_window=a.sign_in_window * 60, reconnect_seconds=max(a.reconnect_seconds, 0))
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(name)s %(message)s', stream=sys.stderr)
    if a.sso_header:
        import psycopg

        from . import db
        try:
            role = db.service_check(a.dsn, a.sso_group)
        except (db.NotChecked, psycopg.Error) as e:
            print(f'idempo console: single sign-on refused: {e}', file=sys.stderr)
            sys.exit(2)
        logging.getLogger('idempo.console').info('single sign-on through the header %s, as the role %s',
                                                 a.sso_header, role)
    import uvicorn
    # uvicorn's access log prints query strings (a searched key); the console logs its own lines
    uvicorn.run(create_app(settings), host=host.strip('[]'), port=int(port), access_log=False,
                log_level='info', proxy_headers=False)


if __name__ == '__main__':
    main()
