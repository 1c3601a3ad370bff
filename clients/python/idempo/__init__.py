"""idempo for Python: "the same business action happens once", enforced by PostgreSQL.

    import idempo

    with conn.transaction():
        with idempo.once(conn, 'stock.reserve', 'order-1001', {'sku': 'A-7', 'qty': 2}) as op:
            if op.acquired:
                conn.execute("UPDATE stock SET reserved = reserved + 2 WHERE sku = 'A-7'")
                op.result = {'reserved': 2}

The blocking API is here (psycopg 3, psycopg2, any DB-API connection, Django, SQLAlchemy);
idempo.aio is the same for psycopg 3's AsyncConnection; idempo.http, idempo.asgi,
idempo.flask and idempo.django hold the Idempotency-Key middleware.  docs/python.md.
"""
from ._types import (ActionFailed, Busy, Claim, ClaimNotReplicated, Conflict, DatabaseRefusal, Done, Expired,
                     IdempoError, InReview, InvalidArgument, InvalidState, LeaseLost, LockNotAvailable, NotAcquired,
                     NotFound, Operation, Outcome, PermissionDenied, ReadOnly, SerializationFailure, Stale, Status,
                     Superseded, UndefinedFunction, Unknown, UnsupportedVersion, from_database_error, sqlstate_of)
from ._sync import (InTransaction, NoTransaction, Once, call_once, claim, complete, fail, heartbeat, idempotent,
                    lookup, once, verify, version)

__version__ = '1.0.1'

__all__ = [
    'ActionFailed', 'Busy', 'Claim', 'ClaimNotReplicated', 'Conflict', 'DatabaseRefusal', 'Done', 'Expired',
    'IdempoError', 'InReview', 'InTransaction', 'InvalidArgument', 'InvalidState', 'LeaseLost', 'LockNotAvailable',
    'NoTransaction', 'NotAcquired', 'NotFound', 'Once', 'Operation', 'Outcome', 'PermissionDenied', 'ReadOnly',
    'SerializationFailure', 'Stale', 'Status', 'Superseded', 'UndefinedFunction', 'Unknown', 'UnsupportedVersion',
    'call_once', 'claim', 'complete', 'fail', 'from_database_error', 'heartbeat', 'idempotent', 'lookup', 'once',
    'sqlstate_of', 'verify', 'version', '__version__',
]
