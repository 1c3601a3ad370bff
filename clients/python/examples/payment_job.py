"""The payment job of docs/python.md with the library: the same behaviour as payment_job_by_hand.py
(docs/python.md compares the two)."""
import idempo

SCOPE = 'jobs.payments'


class Declined(Exception):
    """The provider refused the card: nothing was charged."""


def pay(conn, provider, request):
    key, params = request['key'], {'order': request['order'], 'amount': request['amount']}

    def record(conn, charge):
        conn.execute('INSERT INTO job_payments VALUES (%s, %s)', [key, charge['id']])
        return {'charge': charge['id']}

    # -- dispatch: begin
    done = idempo.call_once(
        conn, SCOPE, key, lambda reference: provider.charge(reference, request['amount']), params=params,
        lookup=provider.find, record=record, target_ref=lambda charge: charge['id'],
        retryable=lambda err: False if isinstance(err, Declined) else True if isinstance(err, ConnectionRefusedError) else None,
        on_busy='wait', busy_timeout=60, retries=50)
    return {'declined': done.error} if done.failed else done.result
    # -- dispatch: end
