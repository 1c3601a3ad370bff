"""The payment job of docs/python.md, written on idempo's SQL API by hand, as the new user did: each
request charges a card at the provider (which does not deduplicate, but can be searched by our
reference) and records the payment.  The lines between the two markers dispatch idempo's
outcomes; docs/python.md counts them."""
import time

import psycopg

SCOPE = 'jobs.payments'


class Declined(Exception):
    """The provider refused the card: nothing was charged."""


def pay(conn, provider, request):
    key, params = request['key'], {'order': request['order'], 'amount': request['amount']}
    reference = f'{SCOPE}/{key}'
    # -- dispatch: begin
    for _ in range(50):
        with conn.transaction():
            outcome, status, attempt, result, error, lease_end, now = conn.execute(
                'SELECT outcome::text, status::text, attempt, result, error, lease_expires_at, idempo.now() '
                'FROM idempo.claim(%s, %s, params => %s::jsonb)', [SCOPE, key, psycopg.types.json.Jsonb(params)]
            ).fetchone()
        if outcome == 'replay':
            return {'declined': error} if status == 'failed' else result
        if outcome == 'conflict':
            raise ValueError(f'{key}: reused with other parameters')
        if outcome in ('in_review', 'stale', 'expired'):
            raise RuntimeError(f'{key}: {outcome}, a person decides')
        if outcome == 'busy':
            time.sleep(min(1.0, max(0.05, (lease_end - now).total_seconds())))
            continue
        if outcome == 'unknown':
            found = provider.find(reference)
            try:
                with conn.transaction():
                    if found:
                        conn.execute('INSERT INTO job_payments VALUES (%s, %s)', [key, found['id']])
                    conn.execute('SELECT idempo.verify(%s, %s, %s, found => %s, target_ref => %s, result => %s)',
                                 [SCOPE, key, attempt, bool(found), found and found['id'],
                                  psycopg.types.json.Jsonb({'charge': found['id']}) if found else None])
            except psycopg.errors.ObjectNotInPrerequisiteState:
                continue                      # the verify race: another worker verified, or a newer attempt
            if found:
                return {'charge': found['id']}
            if conn.execute('SELECT status::text FROM idempo.lookup(%s, %s)', [SCOPE, key]).fetchone()[0] != 'retryable':
                time.sleep(0.2)               # verify_settle has not passed: ask again later
            continue
        try:
            charge = provider.charge(reference, request['amount'])
        except Declined as err:
            conn.execute('SELECT idempo.fail(%s, %s, attempt => %s, error => %s, retryable => false)',
                         [SCOPE, key, attempt, str(err)])
            return {'declined': str(err)}
        except ConnectionRefusedError:        # not ConnectionError: a reset one may have been charged
            conn.execute('SELECT idempo.fail(%s, %s, attempt => %s, error => %s, retryable => true)',
                         [SCOPE, key, attempt, 'request not sent'])
            continue
        except (TimeoutError, ConnectionError):
            continue                          # in doubt: the lease runs out, then unknown -> look it up
        try:
            with conn.transaction():
                conn.execute('INSERT INTO job_payments VALUES (%s, %s)', [key, charge['id']])
                conn.execute('SELECT idempo.complete(%s, %s, attempt => %s, result => %s, target_ref => %s)',
                             [SCOPE, key, attempt, psycopg.types.json.Jsonb({'charge': charge['id']}), charge['id']])
        except psycopg.errors.ObjectNotInPrerequisiteState:
            continue                          # superseded: the newer attempt decides
        return {'charge': charge['id']}
    raise RuntimeError(f'{key}: not settled')
    # -- dispatch: end
