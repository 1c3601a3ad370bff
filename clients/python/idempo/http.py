"""Idempotency-Key for HTTP services, the framework-independent part (idempo.asgi, idempo.flask
and idempo.django are thin adapters over it).

Follows the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field" and Stripe:

  first request                          -> the handler runs; its reply is stored with the key
  the same request again                 -> the stored status, headers and body, plus
                                            "Idempotent-Replayed: true"
  again while the first is still running -> 409 + Retry-After (the claim does not wait)
  the same key, another method/path/body -> 422 (the conflict is recorded in idempo.conflicts)
  missing or malformed key               -> 400 (no claim)
  unknown, in_review, stale, expired     -> 409: a person or a verifier decides
  unknown, on a route with a lookup hook -> this request looks the action up and verifies: found,
                                            the reply it stores (or 409 settled-without-reply);
                                            not found, the request runs as the next attempt;
                                            too early to believe it, 409 key-in-doubt
  settled by a person, no reply stored   -> 409 settled-without-reply (operation_status, target_ref)

Which replies are stored (Route.store, default store_default): everything below 500 except the
statuses that say the request was not taken up (400, 408, 409, 415, 422, 425, 429) or was refused
to this caller (401, 403: a login that had expired, a CSRF check; the caller mended, the same key
runs).  A reply that is not stored leaves no trace in the one-transaction form: the transaction
rolls back (the handler's writes and the claim with them), and a retry runs afresh.  In the
calls_out form the other system may have acted: by default (on_error='doubt') the attempt is left
to its lease (the key answers 409, then turns unknown: a person or a verifier decides); with
on_error='retry', for another system that deduplicates by ctx.provider_key, the attempt is failed
retryable and a retry calls it again.  A request that the framework refused before the view ran
(Django's CSRF check, an auth check in Flask's before_request) called nothing: where the
integration knows it (Context.started is False: idempo.django, idempo.flask) the attempt is
failed retryable whatever on_error says.
"""
from __future__ import annotations

import base64
import datetime as _dt
import inspect
import math
import hashlib
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _flow as F
from ._types import Claim, InvalidArgument, Outcome, Superseded, Unknown, sqlstate_of

MAX_KEY_LENGTH = 255                    # Stripe's limit; idempo itself takes 1024 bytes
# The problem details' type is this base + '#' + the problem's code (Route.docs replaces the base:
# your page of docs/http-contract.md).  The Node middleware's default is the same.
PROBLEM_TYPE_BASE = 'https://idempo.dev/problems'
MAX_BODY_BYTES = 1 << 20                # the middlewares' default max_body (larger: 413)
# Arrays and objects nested deeper in a JSON body are refused (400 json-too-deep) before anything
# parses it: json.loads raised RecursionError (a 500) at about 1,000 levels, 2 KB of '['.  64 is
# System.Text.Json's default; the Node middleware has the same limit.
MAX_JSON_DEPTH = 64
REPLAYED = 'idempotent-replayed'
NOT_STORED_4XX = frozenset({400, 401, 403, 408, 409, 415, 422, 425, 429})
# Not stored and not replayed: they describe one connection, not the reply.
HOP_BY_HOP = frozenset({'connection', 'keep-alive', 'transfer-encoding', 'content-length', 'date', 'server',
                        'upgrade', 'te', 'trailer', 'proxy-authenticate', 'proxy-connection', REPLAYED})
# Not stored unless the route keeps them (Route.keep_headers): they belong to the client that made
# the request, and a replay goes to whoever presents the same key (a session cookie replayed to
# another client is a login handed over).  clients/node/lib/http.js has the same list.
PER_CLIENT = frozenset({'set-cookie', 'set-cookie2', 'authorization', 'proxy-authorization',
                        'authentication-info', 'proxy-authentication-info'})


def store_default(status: int) -> bool:
    """2xx, 3xx and the 4xx a handler decided are stored; 5xx are not (the retry runs again),
    nor the 4xx that say the request was not taken up (bad request, timeout, conflict, wrong
    media type, validation, too early, too many requests) or refused to this caller (401, 403:
    they answer for the caller's credentials, not for the operation)."""
    return status < 500 and status not in NOT_STORED_4XX


def store_all(status: int) -> bool:
    """Every reply is stored, 5xx included (Stripe's rule once the handler has started)."""
    return True


@dataclass
class Reply:
    status: int
    headers: List[Tuple[str, str]]        # names lower case; repeated names kept (set-cookie)
    body: bytes

    def stored(self, keep_headers: Sequence[str] = ()) -> dict:
        """The claim's result: status, headers and body (text, or base64 for other bytes), so a
        replay is byte for byte the original; without the per-client headers (PER_CLIENT) but
        those named in keep_headers."""
        keep = {n.lower() for n in keep_headers}
        out = {'status': self.status, 'headers': [[n, v] for n, v in self.headers
                                                  if n not in HOP_BY_HOP and (n not in PER_CLIENT or n in keep)]}
        try:
            out['body'] = self.body.decode('utf-8')
        except UnicodeDecodeError:
            out['body_base64'] = base64.b64encode(self.body).decode('ascii')
        return out

    @staticmethod
    def is_stored(stored: Any) -> bool:
        """Whether a claim's result is a reply the middleware stored (status, headers, body), rather
        than nothing or what a person or a verifier recorded (resolve, verify).  The Node
        middleware's test is the same."""
        return (isinstance(stored, dict) and type(stored.get('status')) is int and 100 <= stored['status'] <= 599
                and isinstance(stored.get('headers', []), (list, dict))
                and isinstance(stored.get('body', ''), str) and isinstance(stored.get('body_base64', ''), str))

    @classmethod
    def from_stored(cls, stored: dict) -> 'Reply':
        stored_headers = stored.get('headers', [])
        headers = [(n, v) for n, v in (stored_headers.items() if isinstance(stored_headers, dict) else stored_headers)]
        body = (base64.b64decode(stored['body_base64']) if 'body_base64' in stored
                else stored.get('body', '').encode('utf-8'))
        return cls(stored['status'], headers + [(REPLAYED, 'true')], body)

    def header(self, name: str) -> Optional[str]:
        return next((v for n, v in self.headers if n == name), None)


def problem(status: int, slug: str, title: str, detail: str, headers=(), docs: str = 'about:blank',
            extra: Optional[dict] = None) -> Reply:
    """RFC 9457 problem details, as the draft's examples use: type docs#slug (about:blank: an
    app's own problem with no page), and slug again as code; extra: extension members.  The
    middleware's own pass route.docs (PROBLEM_TYPE_BASE by default) and the titles of
    docs/http-contract.md, the Node middleware's."""
    body = json.dumps({'type': f'{docs}#{slug}' if docs != 'about:blank' else docs, 'title': title,
                       'status': status, 'detail': detail, 'code': slug, **(extra or {})}).encode()
    return Reply(status, [('content-type', 'application/problem+json'), *headers], body)


class Refusal(Exception):
    """Answer at once with a reply that is not stored (bad key, bad body)."""

    def __init__(self, reply: Reply):
        super().__init__(reply.body.decode('utf-8', 'replace'))
        self.reply = reply


@dataclass
class RequestInfo:
    method: str
    path: str                       # with the query string
    headers: List[Tuple[str, str]]  # names lower case
    body: bytes
    media_type: str = ''
    json: Any = None
    is_json: bool = False

    def header_values(self, name: str) -> List[str]:
        return [v for n, v in self.headers if n == name]


@dataclass
class Route:
    """One idempotent endpoint.

    scope        the idempo scope of its keys
    calls_out    False: one transaction (the claim, the handler's writes and complete commit
                 together; the handler writes through ctx.conn).  True: the claim commits
                 first, the handler calls the other system (with ctx.provider_key), then
                 ctx.begin() and its writes, which commit with complete.
    methods      the methods that need a key (others pass through)
    key_header   the header carrying the key (None: take it from key_fields)
    key_fields   JSON body fields ("order.id" for nested ones) whose values make the key
    tenant       request -> the client or tenant; keys are unique per tenant
    store        status -> whether the reply is stored (store_default)
    validate     request -> a Reply refusing it before the claim (the key stays unused), or None
    on_error     calls_out, when the handler raises or its reply is not stored: 'doubt' (the
                 default: leave the attempt to its lease; the key answers 409, then turns
                 unknown, and a person or a verifier decides: the other system may have acted,
                 and a second call could do it twice) or 'retry' (fail(retryable), so the retry
                 calls again: only for another system that deduplicates by ctx.provider_key).
                 Either way a request refused before its view ran (Context.started is False:
                 Django's CSRF check, Flask's before_request) is failed retryable
    lease        per-claim lease (idempo 0.3.0's claim(lease =>)); None: the scope's.  calls_out:
                 a heartbeat holds it while the handler runs, until ctx.begin()
    retry_after  seconds in Retry-After of a 503, and of a busy 409 whose lease is not known (the
                 first request's claim not committed yet); a busy 409 with a lease: its seconds left
    keep_headers per-client reply headers to store and replay anyway (('set-cookie',)): by
                 default PER_CLIENT headers (Set-Cookie, Authorization...) are sent to the client
                 that made the request but neither stored nor replayed
    lookup       calls_out routes: provider_key -> what the other system has for the key (None:
                 nothing), as call_once's lookup.  A retry that meets an unknown outcome then
                 takes the verification lease, calls it and verifies: a Reply found is stored and
                 answered (any other value is recorded as the result: 409 settled-without-reply);
                 nothing found, once the scope's verify_settle has passed, makes the request run
                 as the next attempt (before that: 409 key-in-doubt).  Without it (the default) a
                 retry is answered 409 and leaves the verification lease free for a verifier
                 (claim(verify_unknown => false)); an async function in ASGI apps.  A lookup
                 that raises is answered 503 lookup-failed, nothing decided
    lookup_lease seconds of the verification lease a request takes to look up (30): short, so
                 that a lookup that failed locks the retries and the verifier out only so long
    """
    scope: str
    calls_out: bool = False
    methods: Sequence[str] = ('POST',)
    key_header: Optional[str] = 'Idempotency-Key'
    key_fields: Optional[Sequence[str]] = None
    tenant: Optional[Callable[[RequestInfo], Optional[str]]] = None
    store: Callable[[int], bool] = store_default
    validate: Optional[Callable[[RequestInfo], Optional[Reply]]] = None
    on_error: str = 'doubt'
    lease: Any = None
    retry_after: int = 1
    docs: str = PROBLEM_TYPE_BASE
    keep_headers: Sequence[str] = ()
    lookup: Optional[Callable[[str], Any]] = None
    lookup_lease: float = 30

    def __post_init__(self):
        # a misspelt on_error would otherwise act as one of the two without saying which
        if self.on_error not in ('doubt', 'retry'):
            raise ValueError(f"Route({self.scope!r}): on_error must be 'doubt' or 'retry', not {self.on_error!r}")


@dataclass
class Context:
    """What the handler sees (request.state.idempo, flask.g.idempo, request.idempo)."""
    conn: Any
    scope: str
    key: str
    attempt: int
    route: Route
    claim: Claim
    began: bool = False
    _begin: Any = None
    # Whether the view started: None, the integration cannot tell (plain WSGI, ASGI); False, the
    # framework has not run it (yet: a refusal before it, CSRF or auth, leaves it so); True, it
    # ran.  A calls_out attempt whose view never started called nothing, and is freed.
    started: Optional[bool] = None

    @property
    def provider_key(self) -> str:
        """The key to pass to the other system (calls_out routes): scope/key."""
        return f'{self.scope}/{self.key}'

    def begin(self):
        """calls_out routes: open the transaction in which your writes and complete() commit
        (call it after the outside call; an awaitable in ASGI apps)."""
        return self._begin(self)


# The draft sends the key as a Structured Field String ("..."); Stripe's clients send it bare.
SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
VISIBLE_ASCII = re.compile(r'[\x21-\x7e]+')       # no space, no control character, nothing beyond ASCII


def _malformed(route, why):
    return Refusal(problem(400, 'malformed-key', 'Malformed idempotency key', why, docs=route.docs))


def _split_list(value: str) -> List[str]:
    """A field value split at the commas outside quoted strings."""
    items, start, quoted, escaped = [], 0, False, False
    for i, ch in enumerate(value):
        if escaped:
            escaped = False
        elif quoted and ch == '\\':
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == ',' and not quoted:
            items.append(value[start:i])
            start = i + 1
    items.append(value[start:])
    return items


def parse_key_header(route: Route, values: List[str]) -> str:
    if not values:
        raise Refusal(problem(400, 'missing-key', 'Idempotency key is missing',
                              f'This operation requires an {route.key_header} header: a new unique value '
                              '(a UUID) per operation, the same value when retrying it.', docs=route.docs))
    # Two headers arrive as two values (ASGI) or joined by ", " (WSGI, and HTTP's own rule for
    # repeated fields): so a comma outside a quoted string means two keys, refused alike.
    items = [item for value in values for item in _split_list(value)]
    if len(items) != 1:
        raise _malformed(route, f'Send one {route.key_header} header, with one key.')
    key = items[0].strip()
    if key.startswith('"'):
        quoted = SF_STRING.fullmatch(key)
        if not quoted:
            raise _malformed(route, 'Not a valid Structured Field String.')
        key = re.sub(r'\\(["\\])', r'\1', quoted.group(1))
    if not 0 < len(key) <= MAX_KEY_LENGTH:
        raise _malformed(route, f'The key must have 1 to {MAX_KEY_LENGTH} characters.')
    if not VISIBLE_ASCII.fullmatch(key):
        raise _malformed(route, 'The key must be visible ASCII.')
    return key


def key_part(value: str) -> str:
    """A part of a composed key with its '/' (and '%') escaped, so that the parts cannot be
    shifted: tenant "acme/eu" with key "x" and tenant "acme" with key "eu/x" would both be
    "acme/eu/x", and one client would be replayed the other's reply.  Unchanged for a value with
    neither character."""
    return value.replace('%', '%25').replace('/', '%2F') if '/' in value or '%' in value else value


def key_from_fields(route: Route, info: RequestInfo) -> str:
    if not isinstance(info.json, dict):
        raise Refusal(problem(400, 'missing-key', 'Idempotency key is missing',
                              f'Send a JSON object with {", ".join(route.key_fields)}.', docs=route.docs))
    parts = []
    for path in route.key_fields:
        value = info.json
        for name in path.split('.'):
            value = value.get(name) if isinstance(value, dict) else None
        if value is None or isinstance(value, (dict, list)) or value == '':
            raise Refusal(problem(400, 'missing-key', 'Idempotency key is missing',
                                  f'The key field {path} is missing: send {", ".join(route.key_fields)} (strings or numbers).', docs=route.docs))
        parts.append(key_part(json.dumps(value) if not isinstance(value, str) else value))
    return '/'.join(parts)


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_BRACKET = re.compile(rb'[\[\]{}]')


def json_too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON text nests arrays and objects more than limit deep (its strings left out).
    Without recursion, so that no depth makes it fail."""
    if body.count(b'[') + body.count(b'{') <= limit:
        return False
    depth = 0
    for m in _BRACKET.finditer(_JSON_STRING.sub(b'', body)):
        if m.group() in (b'[', b'{'):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def parse_request(route: Route, method: str, path: str, headers: List[Tuple[str, str]], body: bytes) -> RequestInfo:
    media_type = next((v for n, v in headers if n == 'content-type'), '').split(';')[0].strip().lower()
    info = RequestInfo(method.upper(), path, headers, body, media_type)
    if body and (media_type == 'application/json' or media_type.endswith('+json')):
        if json_too_deep(body):
            raise Refusal(problem(400, 'json-too-deep', 'The JSON body is nested too deeply',
                                  f'At most {MAX_JSON_DEPTH} levels of nested arrays and objects.', docs=route.docs))
        try:
            info.json, info.is_json = json.loads(body), True
        except ValueError as err:
            raise Refusal(problem(400, 'invalid-json', 'The body is not valid JSON', str(err), docs=route.docs))
    return info


def key_of(route: Route, info: RequestInfo) -> str:
    key = (parse_key_header(route, info.header_values(route.key_header.lower())) if route.key_header
           else key_from_fields(route, info))
    if route.tenant is not None:
        tenant = route.tenant(info)
        if tenant is None:
            raise Refusal(problem(401, 'no-tenant', 'Who is asking?', 'Idempotency keys are per client; '
                                  'this request names none.', docs=route.docs))
        key = f'{key_part(tenant)}/{key}'
    return key


# The fingerprint covers method, path (with the query) and body.  A JSON body goes in as its raw
# text for PostgreSQL to parse, so key order, whitespace and 1 vs 1.0 do not matter and numbers
# keep every digit; any other body as its media type and SHA-256 (jsonb cannot hold bytes).  Only
# the members a request has: {"method", "path"} and "json", or "media_type" and "sha256", the
# object the Node middleware builds (a member set to null is another fingerprint: a retry sent to
# a service in the other language would be answered 422).
PARAMS_SQL = "jsonb_build_object('method', %s::text, 'path', %s::text)"
PARAMS_SQL_JSON = "jsonb_build_object('method', %s::text, 'path', %s::text, 'json', %s::jsonb)"
PARAMS_SQL_BYTES = "jsonb_build_object('method', %s::text, 'path', %s::text, 'media_type', %s::text, 'sha256', %s::text)"


def params_sql(info: RequestInfo) -> str:
    return PARAMS_SQL_JSON if info.is_json else PARAMS_SQL if not info.body else PARAMS_SQL_BYTES


def params_args(info: RequestInfo) -> tuple:
    if info.is_json:
        return (info.method, info.path, info.body.decode('utf-8'))
    if not info.body:
        return (info.method, info.path)
    return (info.method, info.path, info.media_type, hashlib.sha256(info.body).hexdigest())


def busy_retry_after(route: Route, claim: Claim) -> int:
    """Retry-After of a busy 409: the seconds left on the lease, rounded up, at least 1 (a retry
    sooner is answered 409 again; docs/http-contract.md), by idempo's clock; route.retry_after
    when no lease is known (the first request's claim is not committed yet)."""
    if claim.lease_expires_at is None:
        return route.retry_after
    return max(1, math.ceil(claim.retry_after(1.0)))


def answer_for(route: Route, claim: Claim) -> Reply:
    """The reply when the claim did not hand this request the work."""
    if claim.outcome is Outcome.REPLAY:
        if Reply.is_stored(claim.result):
            return Reply.from_stored(claim.result)
        # settled by a person or a verifier (resolve, verify) with no reply to replay: what is known
        return problem(409, 'settled-without-reply', 'This idempotency key was settled outside this API',
                       'Its outcome was recorded by a person or a verifier, with no reply to replay; do not retry '
                       'it under a new key.', docs=route.docs,
                       extra={'operation_status': claim.status.value if claim.status else None,
                              'target_ref': claim.target_ref})
    if claim.outcome is Outcome.BUSY:
        return problem(409, 'key-in-use', 'A request with this idempotency key is being processed',
                       'Retry later with the same key.', [('retry-after', str(busy_retry_after(route, claim)))],
                       docs=route.docs)
    if claim.outcome is Outcome.CONFLICT:
        return problem(422, 'key-reused', 'This idempotency key was used for a different request',
                       'The key was first used with another method, path or body. Use a new key for a new '
                       'operation.', docs=route.docs)
    return problem(409, 'key-in-review', 'The request with this idempotency key needs attention',
                   f'Its outcome is {claim.outcome.value}; do not retry it under a new key, contact support.',
                   docs=route.docs)


def unavailable(route: Route) -> Reply:
    """503 + Retry-After: the database could not be reached, or the request's connection was lost
    before its outcome committed (a restart).  Nothing is stored for the key (lost during COMMIT,
    nobody can tell: the retry with the same key replays what did commit).  The Node middleware
    answers the same."""
    return problem(503, 'database-unavailable', 'The database could not be reached',
                   'The request was not completed; retry it with the same Idempotency-Key.',
                   [('retry-after', str(route.retry_after))], docs=route.docs)


_CONNECTION_SQLSTATES = frozenset({'57P01', '57P02', '57P03'})


def connection_closed(conn) -> bool:
    """Whether the request's connection, the driver's (None: none was had), is closed: psycopg 3
    closes it when the server has ended it, psycopg2 marks it (.closed 2)."""
    if conn is None:
        return False
    closed = getattr(conn, 'closed', False)          # psycopg 3: a bool; psycopg2: 0 when open
    return closed is True or (type(closed) is int and closed != 0)


def connection_lost(err: BaseException, conn=None) -> bool:
    """Whether err means that the connection was lost, or none could be had: conn (the request's,
    None if none was had) is closed (psycopg 3 closes it when the server has ended it, psycopg2
    marks it), the SQLSTATE is of class 08 or 57P01-57P03 (terminated by an administrator or a
    shutdown, not accepting connections yet), or no connection was had and the error is a
    driver's OperationalError or a pool's PoolTimeout."""
    if connection_closed(conn):
        return True
    code = sqlstate_of(err)
    if code is not None:
        return code.startswith('08') or code in _CONNECTION_SQLSTATES
    return conn is None and any(c.__name__ in ('OperationalError', 'PoolTimeout') for c in type(err).__mro__)


def _invalid_json(err) -> bool:
    return isinstance(err, InvalidArgument) or sqlstate_of(err) in ('22P02', '22P05', '22025', '22032')


def _claim(route, info, key, verify, fast=True):
    try:
        return (yield from F.claim_flow(route.scope, key, params_sql=params_sql(info), params_args=params_args(info),
                                        wait=False, lease=route.lookup_lease if verify else route.lease, fast=fast,
                                        narrow=not fast, now=True,
                                        verify_unknown=verify))
    except Exception as err:
        # JSON that Python accepts and jsonb does not (\u0000, a lone surrogate)
        if sqlstate_of(err) in ('22P02', '22P05', '22025', '22032'):
            raise Refusal(problem(400, 'invalid-json', 'The body is not valid JSON', str(err).split('\n')[0],
                                  docs=route.docs))
        raise


# On a route with a lookup, a claim answered unknown (it took no verification lease, as every claim
# first) is claimed again taking the verification lease, with the route's short lookup_lease: a
# lookup that fails (the other system down) then locks the retries and the verifier out for that
# long, not for the attempt's lease (the claim's lease => applies to the verification lease).  A
# retry that verified and found nothing claims again (the next attempt); a verify race claims
# again too.  Twice at most: the claim after that takes no verification lease, it is answered.
VERIFIES = 2


class LookupFailed(Exception):
    """The route's lookup raised: nothing was decided."""


def _guarded(lookup):
    """The lookup, its own exceptions raised as LookupFailed (a database error is not one)."""
    if inspect.iscoroutinefunction(lookup):
        async def guarded(provider_key):
            try:
                return await lookup(provider_key)
            except Exception as err:
                raise LookupFailed(F.error_text(err)) from err
        return guarded

    def guarded(provider_key):
        try:
            return lookup(provider_key)
        except Exception as err:
            raise LookupFailed(F.error_text(err)) from err
    return guarded


def lookup_failed(route: Route) -> Reply:
    """503 lookup-failed: the route's lookup raised; nothing decided, the verification lease (the
    route's lookup_lease) runs out and the next retry looks again.  The Node middleware answers the
    same."""
    return problem(503, 'lookup-failed', 'The outcome of the request with this idempotency key could not be looked up',
                   'Nothing was decided; retry later with the same key.',
                   [('retry-after', str(max(1, math.ceil(float(route.lookup_lease)))))], docs=route.docs)


def in_doubt(route: Route, doubt: Unknown) -> Reply:
    """409 key-in-doubt: the route's lookup found nothing, too early to believe it (the scope's
    verify_settle after the attempt's lease has not passed).  The Node middleware answers the same."""
    settles_at = getattr(doubt, 'settles_at', None)
    return problem(409, 'key-in-doubt', 'The outcome of the request with this idempotency key is not known yet',
                   'It was looked up and not found, too early to be sure that it did not happen; retry later with '
                   'the same key.', [('retry-after', str(route.retry_after))], docs=route.docs,
                   extra={'settles_at': iso_utc(settles_at) if settles_at is not None else None})


def iso_utc(when) -> str:
    """ISO 8601 in UTC with milliseconds and 'Z', as JavaScript's toISOString (the Node middleware's
    settles_at): one format in both."""
    return when.astimezone(_dt.timezone.utc).isoformat(timespec='milliseconds').replace('+00:00', 'Z')


def _verify_unknown(route: Route, key: str, claim: Claim):
    """The claim answered unknown and this request holds the verification lease (the route has a
    lookup; the claim committed): look the action up and verify.  -> the Reply, or None when the
    key is to be claimed again (not found and retryable now, or another verifier won the race)."""
    stored = route.keep_headers

    def result_of(conn, found):
        return found.stored(stored) if isinstance(found, Reply) else found
    try:
        done = yield from F.verify_flow(None, claim, f'{route.scope}/{key}', _guarded(route.lookup), result_of, None)
    except LookupFailed:
        return lookup_failed(route)
    except Superseded:
        return None
    except Unknown as doubt:
        return in_doubt(route, doubt)
    if done is None:
        return None
    return answer_for(route, replace(claim, outcome=Outcome.REPLAY, status=done.status, result=done.result,
                                     target_ref=done.target_ref))


def _answer(route: Route, key: str, claim: Claim, verified: bool):
    """The reply to a claim that did not hand this request the work (None: claim again)."""
    if verified and claim.outcome is Outcome.UNKNOWN:
        return (yield from _verify_unknown(route, key, claim))
    return answer_for(route, claim)


def _claims(route: Route, info: RequestInfo, key: str, one_transaction: bool):
    """Claim until acquired or answered.  -> (the acquired claim, None) or (None, the reply).
    one_transaction: an acquired claim's transaction stays open for the handler (and a claim
    that fails rolls back); else every claim commits."""
    verify, verifies = False, VERIFIES
    while True:
        yield F.Begin()
        try:
            claim = yield from _claim(route, info, key, verify, fast=one_transaction)
        except BaseException:
            yield F.Rollback() if one_transaction else F.Commit()
            raise
        if not (one_transaction and claim.outcome is Outcome.ACQUIRED):
            yield F.Commit()              # a claim may have written (a review, a conflict, a lease): keep it
        if claim.outcome is Outcome.ACQUIRED:
            return claim, None
        if claim.outcome is Outcome.UNKNOWN and route.lookup is not None and not verify and verifies > 0:
            verify, verifies = True, verifies - 1          # again, taking the verification lease
            continue
        reply = yield from _answer(route, key, claim, verify)
        if reply is not None:
            return None, reply
        verify = False


def one_transaction_flow(conn, route: Route, info: RequestInfo, key: str, handler):
    """Claim, the handler and complete in one transaction.  -> Reply."""
    claim, reply = yield from _claims(route, info, key, True)
    if reply is not None:
        return reply
    return (yield from _handle_in_transaction(conn, route, key, claim, handler))


def _handle_in_transaction(conn, route: Route, key: str, claim: Claim, handler):
    """The handler and complete in the claim's transaction (still open).  -> Reply."""
    try:
        ctx = Context(conn, route.scope, key, claim.attempt, route, claim, began=True)
        reply = yield F.Call(handler, (ctx,))
        if not route.store(reply.status):
            yield F.Rollback()        # not stored: no trace, the retry runs afresh
            return reply
        yield F.Sql(F.COMPLETE_SQL, (route.scope, key, claim.attempt, F.to_json(reply.stored(route.keep_headers)), None))
    except BaseException:
        yield F.Rollback()
        raise
    yield F.Commit()
    return reply


def calls_out_flow(conn, route: Route, info: RequestInfo, key: str, handler):
    """The claim commits; the handler calls out, then ctx.begin() and writes; complete commits
    with the writes.  -> Reply."""
    # not the fast columns: the acquired attempt's lease end sets its heartbeat
    claim, reply = yield from _claims(route, info, key, False)
    if reply is not None:
        return reply
    ctx = Context(conn, route.scope, key, claim.attempt, route, claim)
    # The heartbeat holds the attempt's lease while the handler calls out, as call_once's does: an
    # outside call longer than the lease would otherwise turn the key unknown under it, and a
    # retry's lookup (or a verifier) that finds nothing yet would run the next attempt, a second
    # call.  ctx.begin() stops it before the transaction opens on the same connection; every exit
    # below stops it too (stopping twice is nothing).  A beat refused (the lease was lost) needs no
    # answer: complete() is fenced by the attempt.
    beat = F.heartbeat_for(claim)
    if beat is not None:
        yield beat
    try:
        reply = yield F.Call(handler, (ctx,))
    except BaseException as err:
        yield F.HeartbeatStop()
        if ctx.began:
            yield F.Rollback()
        yield from _release(route, claim, err, ctx.started)
        raise
    yield F.HeartbeatStop()
    if not route.store(reply.status):
        if ctx.began:
            yield F.Rollback()
        yield from _release(route, claim, f'HTTP {reply.status} (not stored)', ctx.started)
        return reply
    if not ctx.began:
        yield F.Begin()
    try:
        yield F.Sql(F.COMPLETE_SQL, (route.scope, key, claim.attempt, F.to_json(reply.stored(route.keep_headers)), None))
    except BaseException as err:
        yield F.Rollback()
        yield from _release(route, claim, err)
        raise
    yield F.Commit()
    return reply


def _release(route, claim, why, started=None):
    """Fail the attempt retryable if the route says so (on_error='retry'), or if its view never
    started (nothing was called); otherwise leave it to its lease."""
    if started is False:       # whatever on_error says: the other system was not called
        why = RuntimeError(f'{why if isinstance(why, str) else F.error_text(why)} before the view ran')
    elif route.on_error != 'retry':
        return
    yield from F.after_error(claim, lambda e: True, True, why if isinstance(why, BaseException) else RuntimeError(why))


def flow_for(conn, route: Route, info: RequestInfo, key: str, handler):
    """The route's flow; a Refusal raised in it (a body that jsonb refuses) is answered with its reply."""
    try:
        return (yield from (calls_out_flow if route.calls_out else one_transaction_flow)(conn, route, info, key,
                                                                                       handler))
    except Refusal as refusal:
        return refusal.reply


def serve(runner, conn, route: Route, info: RequestInfo, key: str, app: Callable[[Context], Reply]) -> Reply:
    """The route's flow on a blocking runner (idempo.wsgi, idempo.django; idempo.asgi awaits the
    same): app(ctx) runs the framework's handler, and ctx.begin() opens the runner's transaction
    once."""
    def begin(ctx):
        if not ctx.began:
            runner.do(F.HeartbeatStop())       # before the transaction opens on the same connection
            runner.begin()
            ctx.began = True

    def handler(ctx):
        ctx._begin = begin
        return app(ctx)
    return runner.run(flow_for(conn, route, info, key, handler))


def cgi_headers(meta) -> List[Tuple[str, str]]:
    """The request's headers from a WSGI environ or Django's request.META, names lower case."""
    headers = [(k[5:].replace('_', '-').lower(), v) for k, v in meta.items() if k.startswith('HTTP_')]
    if meta.get('CONTENT_TYPE'):
        headers.append(('content-type', meta['CONTENT_TYPE']))
    return headers


# A path parameter as the frameworks write one: FastAPI/Starlette '{id}', '{id:int}', '{p:path}';
# Flask and Django '<id>', '<int:id>', '<path:p>'.
_PARAMETER = re.compile(r'\{(?P<a>[^{}]*)\}|<(?P<b>[^<>]*)>')


# What int and uuid converters take (the union of the three frameworks'): '/orders/abc' is not
# '/orders/<int:id>''s, and the endpoint the framework runs for it (another route, not listed
# here) must not be made to require a key.  Other converters: any one segment.
_CONVERTERS = {'int': r'\d+', 'uuid': r'[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}'}


def _template(path: str) -> Optional['re.Pattern[str]']:
    """-> the regular expression of a path with parameters (one non-empty segment each; the
    path converter: the rest, slashes included), None for a plain path."""
    parts, end = [], 0
    for m in _PARAMETER.finditer(path):
        braces = m.group('a') is not None          # {name:converter}; <converter:name>
        spec = m.group('a') if braces else m.group('b')
        converter = spec.split(':', 1)[1 if braces else 0] if ':' in spec else ''
        # the path converter: Starlette's matches an empty rest too ('.*'), Flask's and Django's not
        rest = '.*' if braces else '.+'
        parts.append(re.escape(path[end:m.start()]) + (rest if converter == 'path' else _CONVERTERS.get(converter, '[^/]+')))
        end = m.end()
    if not parts:
        return None
    return re.compile(''.join(parts) + re.escape(path[end:]))


class Routes:
    """The idempotent endpoints of an app: {path: Route} (the path without its query).  A path
    may name parameters as the framework writes its endpoint ('/orders/{order_id}/refund',
    '/orders/<int:order_id>/refund'): each matches one segment that is not empty, a path
    converter ('{p:path}', '<path:p>') the rest.  An exact path wins over a template; templates
    are tried in the order given; as the framework does, the first whose methods include the
    request's (an exact path without it falls through to the templates).  A path starts with
    '/' (the request's does; Django's path() writes its patterns without one: a route written so
    would match nothing, and leave its endpoint unprotected): ValueError otherwise."""

    def __init__(self, routes: Dict[str, Route]):
        for path in routes:
            if not isinstance(path, str) or not path.startswith('/'):
                raise ValueError(f"a route's path starts with '/', as the request's does: {path!r} would match no "
                                 f"request (Django's path() writes 'orders/<int:id>': write '/orders/<int:id>', "
                                 f"with the prefix of any include())")
        self.routes = dict(routes)
        self.templates = [(pattern, route) for path, route in self.routes.items()
                          for pattern in [_template(path)] if pattern is not None]
        # each route's methods in upper case; methods='POST' (a str is a Sequence[str] too) is
        # ('POST',), not the letters P, O, S, T that matched no request
        self.route_methods = {id(route): frozenset(m.upper() for m in ((route.methods,) if isinstance(route.methods, str)
                                                                         else route.methods))
                              for route in self.routes.values()}
        self.methods = frozenset().union(*self.route_methods.values())

    @classmethod
    def of(cls, routes: Union[Dict[str, Route], 'Routes']) -> 'Routes':
        return routes if isinstance(routes, cls) else cls(routes)

    def match(self, method: str, path: str) -> Optional[Route]:
        if method.upper() not in self.methods:      # a GET passes by without a look at the templates
            return None
        path = path.split('?', 1)[0]
        method = method.upper()
        route = self.routes.get(path)
        if route is not None and method in self.route_methods[id(route)]:
            return route
        return next((r for pattern, r in self.templates
                     if method in self.route_methods[id(r)] and pattern.fullmatch(path)), None)

    @staticmethod
    def prepare(route: Route, method: str, path: str, headers, body: bytes):
        """-> (RequestInfo, key); raises Refusal with the reply for a bad key or body."""
        info = parse_request(route, method, path, headers, body)
        if route.key_header:                 # a bad key is answered before the body is looked at
            key_of(route, info)
        if route.validate is not None:
            invalid = route.validate(info)
            if invalid is not None:
                raise Refusal(invalid)
        return info, key_of(route, info)
