"""Idempotency-Key for http.server services, on idempo's SQL API only (psycopg 3).

Follows the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field" and Stripe:
  first request                          -> the handler runs; its reply is stored with the key
  the same request again                 -> the stored reply, with "Idempotent-Replayed: true"
  again while the first is still running -> 409 (the claim does not wait: wait => false)
  the same key, another method/path/body -> 422
  missing or malformed key               -> 400
Requests that fail validation are refused before the claim, so they use up no key (Stripe).
"""
import hashlib
import json
import re
import sys
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

MAX_KEY_LENGTH = 255                    # Stripe's limit; idempo itself takes 1024 bytes
MAX_BODY_BYTES = 1 << 20
DOCS = 'https://example.com/docs/idempotency'   # point problem types at your API docs


@dataclass
class Reply:
    """Status, headers and the body as text.  Stored verbatim as the claim's result, so a replay
    is byte-for-byte the original (a jsonb body would come back with its keys reordered)."""
    status: int
    headers: dict
    body: str

    def stored(self):
        return {'status': self.status, 'headers': self.headers, 'body': self.body}


def json_reply(status, value, headers=None):
    return Reply(status, {'content-type': 'application/json', **(headers or {})}, json.dumps(value))


def problem(status, slug, title, detail, headers=None):
    """RFC 9457 problem details, as the draft's examples use."""
    return Reply(status, {'content-type': 'application/problem+json', **(headers or {})},
                 json.dumps({'type': f'{DOCS}#{slug}', 'title': title, 'status': status, 'detail': detail}))


class Refusal(Exception):
    """Answer at once with a reply that is not stored (bad key, bad body)."""

    def __init__(self, reply):
        super().__init__(reply.body)
        self.reply = reply


@dataclass
class Request:
    key: str
    method: str
    path: str                 # with the query string
    media_type: str
    raw: bytes
    is_json: bool = False
    json: object = None


# The draft sends the key as a Structured Field String ("..."); Stripe's clients send it bare.
# Accept both, and only visible ASCII, so that keys log and compare plainly.
SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
VISIBLE_ASCII = re.compile(r'[\x20-\x7e]+')


def parse_key(values):
    def malformed(why):
        return Refusal(problem(400, 'malformed-key', 'Malformed Idempotency-Key', why))
    if not values:
        raise Refusal(problem(400, 'missing-key', 'Idempotency-Key is missing',
                              'This operation requires an Idempotency-Key header: a new unique value (a UUID) '
                              'per operation, the same value when retrying it.'))
    if len(values) > 1:
        raise malformed('Send one Idempotency-Key header.')
    key = values[0].strip()
    if key.startswith('"'):
        quoted = SF_STRING.fullmatch(key)
        if not quoted:
            raise malformed('Not a valid Structured Field String.')
        key = re.sub(r'\\(["\\])', r'\1', quoted.group(1))
    if not 0 < len(key) <= MAX_KEY_LENGTH:
        raise malformed(f'The key must have 1 to {MAX_KEY_LENGTH} characters.')
    if not VISIBLE_ASCII.fullmatch(key):
        raise malformed('The key must be visible ASCII.')
    return key


def read_body(http):
    """The body of a BaseHTTPRequestHandler's request (http.server needs Content-Length)."""
    chunked = 'chunked' in http.headers.get('Transfer-Encoding', '').lower()
    length = http.headers.get('Content-Length') or '0'
    if chunked or not length.isdigit() or int(length) > MAX_BODY_BYTES:
        http.close_connection = True            # the body stays unread: drop the connection after answering
        if chunked:
            raise Refusal(problem(411, 'length-required', 'Send Content-Length', 'Chunked bodies are not accepted.'))
        if not length.isdigit():
            raise Refusal(problem(400, 'bad-length', 'Bad Content-Length', length))
        raise Refusal(problem(413, 'too-large', 'Request body too large', f'At most {MAX_BODY_BYTES} bytes.'))
    return http.rfile.read(int(length))


def prepare(http):
    """Everything the middleware and the handler need: key, method, path, body.
    In a multi-tenant API, prefix the key with the authenticated client (f'{account}/{key}'):
    keys are unique per client, not across clients."""
    raw = read_body(http)         # first: an unread body would corrupt the next keep-alive request
    key = parse_key(http.headers.get_all('Idempotency-Key'))
    media_type = http.headers.get('Content-Type', '').split(';')[0].strip().lower()
    request = Request(key, http.command, http.path, media_type, raw)
    if raw and (media_type == 'application/json' or media_type.endswith('+json')):
        try:
            request.json, request.is_json = json.loads(raw), True
        except ValueError as err:
            raise Refusal(problem(400, 'invalid-json', 'The body is not valid JSON', str(err)))
    return request


# The request fingerprint covers method, path (with the query) and body.  A JSON body goes in as
# its raw text for PostgreSQL to parse, so key order, whitespace and 1 vs 1.0 do not matter, and
# numbers keep every digit (json.loads would round 0.1000000000000000001).  Any other body goes
# in as its media type and SHA-256: jsonb cannot hold arbitrary bytes, and the fingerprint needs
# only the digest.
PARAMS_SQL = """jsonb_build_object('method', %s::text, 'path', %s::text, 'json', %s::jsonb,
                                   'media_type', %s::text, 'sha256', %s::text)"""


def params_args(request):
    if request.is_json:
        return [request.method, request.path, request.raw.decode('utf-8'), None, None]
    if not request.raw:
        return [request.method, request.path, None, None, None]
    return [request.method, request.path, None, request.media_type, hashlib.sha256(request.raw).hexdigest()]


def claim_key(conn, scope, request):
    try:
        return conn.execute(
            f'SELECT outcome::text, attempt, result FROM idempo.claim(%s, %s, params => {PARAMS_SQL}, wait => false)',
            [scope, request.key, *params_args(request)]).fetchone()
    except (psycopg.errors.InvalidTextRepresentation, psycopg.errors.UntranslatableCharacter) as err:
        # JSON that Python accepts but jsonb does not (a \u0000 escape, a lone surrogate)
        raise Refusal(problem(400, 'invalid-json', 'The body is not valid JSON', str(err)))


def answer_for(outcome, result):
    """What to answer when the claim did not hand us the work."""
    if outcome == 'replay':
        return Reply(result['status'], {**result['headers'], 'idempotent-replayed': 'true'}, result['body'])
    if outcome == 'busy':
        return problem(409, 'key-in-use', 'A request with this Idempotency-Key is being processed',
                       'Retry later with the same key.', {'retry-after': '1'})
    if outcome == 'conflict':
        return problem(422, 'key-reused', 'This Idempotency-Key was used for a different request',
                       'The key was first used with another method, path or body. Use a new key for a new operation.')
    # unknown, in_review, stale, expired: nothing automatic may run it again; a person decides
    return problem(409, 'key-in-review', 'The request with this Idempotency-Key needs attention',
                   f'Its outcome is {outcome}; do not retry it under a new key, contact support.')


def in_one_transaction(conn, scope, request, handler):
    """One transaction: claim, the handler's writes and complete() commit together or not at all.
    If the handler raises, the rollback takes the claim with it: the key is free again and a
    retry runs the handler afresh.  Use this when the handler only writes to this database.
    The block also commits when the claim was not acquired: a claim may have written in this
    transaction (a review it opened; a conflict row when idempo's recorder could not run)."""
    with conn.transaction():
        outcome, _, result = claim_key(conn, scope, request)
        if outcome != 'acquired':
            return answer_for(outcome, result)
        reply = handler(conn, request)
        conn.execute('SELECT idempo.complete(%s, %s, result => %s)', [scope, request.key, Jsonb(reply.stored())])
        return reply


def with_lease(conn, scope, request, call_out, record):
    """Two transactions, for a handler that calls an outside system (which cannot join our
    transaction; and no transaction should stay open across a network call):
      1. the claim commits at once: the key is held by a lease (the scope's "lease");
      2. call_out() calls the outside system, with no transaction open;
      3. record() writes the business row, and complete(attempt) commits with it.
    If 2 or 3 fails, fail(retryable) frees the key at once for a retry.  That is right here only
    because call_out passes our key on and the outside system honours it: a retry cannot act
    twice there.  (Without that, do not call fail after an unclear call: let the lease run out
    to 'unknown' and verify.)  If the process dies before fail, the lease runs out and, in a
    scope with on_lease_expiry => 'retry', the next retry takes the key over as the next attempt."""
    outcome, attempt, result = claim_key(conn, scope, request)     # autocommit: committed now
    if outcome != 'acquired':
        return answer_for(outcome, result)
    try:
        outside = call_out(request, f'{scope}/{request.key}')
    except Exception as err:
        release(conn, scope, request.key, attempt, err)
        return problem(502, 'upstream-failed', 'The payment provider did not answer',
                       'Nothing was recorded; retry with the same Idempotency-Key.')
    try:
        with conn.transaction():
            reply = record(conn, request, outside)
            conn.execute('SELECT idempo.complete(%s, %s, attempt => %s, result => %s)',
                         [scope, request.key, attempt, Jsonb(reply.stored())])
            return reply
    except Exception as err:
        release(conn, scope, request.key, attempt, err)
        raise


def release(conn, scope, key, attempt, err):
    """fail(retryable): this attempt left nothing behind here.  Refused (and only logged) when the
    attempt was superseded after its lease ran out: then the key is not ours to release."""
    try:
        conn.execute('SELECT idempo.fail(%s, %s, attempt => %s, error => %s, retryable => true)',
                     [scope, key, attempt, str(err)[:500]])
    except psycopg.Error as refused:
        print(f'idempo.fail({scope}, {key}, attempt {attempt}) refused: {refused}', file=sys.stderr)


@dataclass
class Route:
    """One endpoint: handler for the one-transaction form, or call_out and record for the
    two-transaction form.  validate(request) returns a problem Reply or None; it runs before
    the claim."""
    scope: str
    validate: object
    handler: object = None
    call_out: object = None
    record: object = None


def serve(conn, route, http):
    """The whole middleware for one request; conn is an autocommit psycopg connection."""
    request = prepare(http)
    invalid = route.validate(request)
    if invalid:
        return invalid
    if route.call_out:
        return with_lease(conn, route.scope, request, route.call_out, route.record)
    return in_one_transaction(conn, route.scope, request, route.handler)


def send(http, reply):
    body = reply.body.encode('utf-8')
    http.send_response(reply.status)
    for name, value in reply.headers.items():
        http.send_header(name, value)
    http.send_header('Content-Length', str(len(body)))
    http.end_headers()
    http.wfile.write(body)
