"""The console over HTTP, as a browser without JavaScript uses it: sign-in, sessions, CSRF,
headers, what each person sees, deciding, and a decision on a page that went stale."""
import html
import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import psycopg

from conftest import text_of


def record_path(scope, key):
    return '/record?' + urllib.parse.urlencode({'scope': scope, 'key': key})


def test_sign_in_with_the_role_and_its_password(data, console, person):
    c = console()
    p = person(c)
    status, body, headers, url = p.get('/')
    assert url.endswith('/login') and 'Sign in' in body               # not signed in: the sign-in page
    status, body, _, _ = p.post('/login', p.login_form('alice', 'wrong'))
    assert status == 401 and 'Sign-in failed' in body and 'wrong' not in body
    status, body, _, _ = p.post('/login', p.login_form('nobody', 'x'))
    assert status == 401
    p.sign_in('alice')
    status, body, headers, _ = p.get('/')
    assert status == 200 and 'Signed in as' in body
    csp = headers['Content-Security-Policy']
    assert "default-src 'none'" in csp and 'script-src' not in csp and "frame-ancestors 'none'" in csp
    cookie = headers.get('Set-Cookie') or ''
    assert 'alice-pw' not in body and 'alice-pw' not in cookie
    assert 'alice-pw' not in c.logs() and 'alice' not in c.logs()    # neither the password nor who signs in
    # signing out ends the session: the same cookie no longer opens a page
    form = re.search(r'name="csrf" value="([^"]+)"', body).group(1)
    p.post('/logout', {'csrf': form})
    status, body, _, url = p.get('/')
    assert url.endswith('/login')


def test_sessions_expire(data, console, person):
    c = console('--session-minutes', '0')
    p = person(c)
    p.post('/login', p.login_form('alice', 'alice-pw'), follow=False)
    status, body, _, url = p.get('/')
    assert url.endswith('/login'), 'a session past its idle time still opened a page'


def test_every_change_needs_the_sessions_csrf_token(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    p = person(console()).sign_in('alice')
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    form = p.form(body, 'resolve')
    for csrf in (None, '', 'forged'):
        f = dict(form, resolution='failed', note='n', confirm='yes')
        if csrf is None:
            del f['csrf']
        else:
            f['csrf'] = csrf
        status, body, _, _ = p.post('/decide', f)
        assert status == 403 and 'not valid' in body
    assert data.status('billing.charge', 'inv-1') == 'unknown'


def test_a_decision_needs_a_note_and_the_confirmation(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    p = person(console()).sign_in('alice')
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    form = p.form(body, 'resolve')
    status, body, _, _ = p.post('/decide', dict(form, resolution='failed', note='  ', confirm='yes'))
    assert status == 422 and 'needs a note' in body
    status, body, _, _ = p.post('/decide', dict(form, resolution='failed', note='why'))
    assert status == 422 and 'confirmation' in body
    assert data.status('billing.charge', 'inv-1') == 'unknown'


def test_resolve_records_the_signed_in_person(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    data.sql("SELECT idempo.request_review('billing.charge', 'inv-1', 'the customer asks')")
    p = person(console()).sign_in('alice')
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'resolve'), resolution='succeeded', target_ref='ch_77',
                                                 note='found in the provider', confirm='yes', reviewer='mallory'))
    assert status == 200 and 'Resolved as succeeded' in body, body
    assert data.status('billing.charge', 'inv-1') == 'succeeded'
    assert data.one("SELECT target_ref FROM idempo.operations WHERE key = 'inv-1'")[0] == 'ch_77'
    # the history shows the decision, made by alice (the role), whatever a form says
    assert re.search(r'<td>resolve</td><td>in_review</td><td>succeeded</td><td>1</td><td></td><td>alice</td>', body)
    assert data.one("SELECT actor FROM idempo.events WHERE action = 'resolve'")[0] == 'alice'
    assert data.one("SELECT resolved_by, note FROM idempo.reviews WHERE key = 'inv-1'") == ('alice', 'found in the provider')


def test_verify_and_resolve_a_conflict(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    cid = data.conflict('billing.charge', 'inv-9', {'amount': 10, 'currency': 'EUR'}, {'amount': 12, 'currency': 'EUR'})
    p = person(console()).sign_in('alice')
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'verify'), found='true', target_ref='ch_1',
                                                 note='seen in the provider', confirm='yes'))
    assert status == 200 and 'Verified (found)' in body
    assert data.status('billing.charge', 'inv-1') == 'succeeded'
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-9'))
    assert '<tr class="differs"><th scope="row">amount (differs)</th>' in body
    assert 'currency (differs)' not in body
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'resolve_conflict', conflict_id=str(cid)),
                                                 resolution='kept_stored', note='the first order stands', confirm='yes'))
    assert status == 200 and f'Conflict {cid} resolved' in body
    assert data.one('SELECT resolved_by, resolution, note FROM idempo.conflicts WHERE id = %s', (cid,)) == \
        ('alice', 'kept_stored', 'the first order stands')


def test_a_stale_page_is_refused_and_shows_the_new_state(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    c = console()
    alice, carol = person(c).sign_in('alice'), person(c).sign_in('carol')
    _, alice_page, _, _ = alice.get(record_path('billing.charge', 'inv-1'))
    _, carol_page, _, _ = carol.get(record_path('billing.charge', 'inv-1'))
    # carol decides first: not executed (the record becomes retryable)
    status, body, _, _ = carol.post('/decide', dict(carol.form(carol_page, 'resolve'), resolution='not_executed',
                                                     note='not in the provider', confirm='yes'))
    assert status == 200 and data.status('billing.charge', 'inv-1') == 'retryable'
    # the application claims it again and the new attempt's lease runs out: unknown again, the
    # status alice's page showed, but not the same record
    data.unknown('billing.charge', ['inv-1'])
    assert data.status('billing.charge', 'inv-1') == 'unknown'
    status, body, _, _ = alice.post('/decide', dict(alice.form(alice_page, 'resolve'), resolution='succeeded',
                                                     target_ref='ch_1', note='found it', confirm='yes'))
    assert status == 409 and 'changed since you read it' in body and 'nothing was decided' in body
    assert '<dd id="status">unknown</dd>' in body and '<dt>Attempt</dt><dd>2' in body   # the new state: attempt 2
    assert data.status('billing.charge', 'inv-1') == 'unknown'
    assert data.one("SELECT count(*) FROM idempo.events WHERE action = 'resolve' AND actor = 'alice'")[0] == 0


def test_a_conflict_resolved_meanwhile_is_refused(data, console, person):
    cid = data.conflict('billing.charge', 'inv-9', {'amount': 10}, {'amount': 12})
    c = console()
    alice, carol = person(c).sign_in('alice'), person(c).sign_in('carol')
    _, page, _, _ = alice.get(record_path('billing.charge', 'inv-9'))
    _, carol_page, _, _ = carol.get(record_path('billing.charge', 'inv-9'))
    status, _, _, _ = carol.post('/decide', dict(carol.form(carol_page, 'resolve_conflict'), resolution='dismissed',
                                                  note='dup', confirm='yes'))
    assert status == 200
    status, body, _, _ = alice.post('/decide', dict(alice.form(page, 'resolve_conflict'), resolution='new_key',
                                                     note='sent again', confirm='yes'))
    assert status == 409 and 'changed since you read it' in body
    assert data.one('SELECT resolved_by, resolution FROM idempo.conflicts WHERE id = %s', (cid,)) == ('carol', 'dismissed')


def test_a_role_sees_and_decides_nothing_of_other_scopes(data, console, person):
    data.unknown('billing.charge', ['inv-1', 'inv-2'])
    data.unknown('shop.order', ['order-1'])
    data.sql("SELECT idempo.request_review('billing.charge', 'inv-2', 'manual')")
    cid = data.conflict('billing.charge', 'inv-9', {'amount': 10}, {'amount': 12})
    c = console()
    alice, bob = person(c).sign_in('alice'), person(c).sign_in('bob')
    for path in ('/', '/unknown', '/reviews', '/conflicts', '/unknown?scope=billing.charge',
                 '/reviews?scope=billing.charge', '/conflicts?q=inv-9', '/unknown?q=inv-1'):
        _, body, _, _ = bob.get(path)
        assert 'billing' not in body and 'inv-' not in body, path
    _, body, _, _ = bob.get('/unknown')
    assert 'order-1' in body
    for path in (record_path('billing.charge', 'inv-1'), '/scopes/billing.charge'):
        status, body, _, _ = bob.get(path)
        assert status == 404 and 'inv-1' not in body and 'amount' not in body
    # a form copied from alice's page, sent with bob's session: refused, nothing decided
    _, page, _, _ = alice.get(record_path('billing.charge', 'inv-1'))
    _, own, _, _ = bob.get('/unknown')
    bob_csrf = re.search(r'name="csrf" value="([^"]+)"', own).group(1)
    status, body, _, _ = bob.post('/decide', dict(alice.form(page, 'resolve'), csrf=bob_csrf, resolution='failed',
                                                   note='x', confirm='yes'))
    assert status in (403, 404) and data.status('billing.charge', 'inv-1') == 'unknown'
    _, page, _, _ = alice.get(record_path('billing.charge', 'inv-9'))
    status, body, _, _ = bob.post('/decide', dict(alice.form(page, 'resolve_conflict'), csrf=bob_csrf,
                                                   resolution='dismissed', note='x', confirm='yes'))
    assert status in (403, 404)
    assert data.one('SELECT resolved_at FROM idempo.conflicts WHERE id = %s', (cid,))[0] is None


def test_a_script_key_is_shown_as_text(data, console, person):
    key = '<script>alert(1)</script>"\'&'
    data.unknown('billing.charge', [key])
    p = person(console()).sign_in('alice')
    for path in ('/unknown', '/', record_path('billing.charge', key)):
        _, body, _, _ = p.get(path)
        assert '<script>' not in body, path
        assert key[:16] in text_of(body), path
    assert key in text_of(body)      # the record page: the whole key, as text
    _, body, _, _ = p.get(record_path('billing.charge', key))
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'resolve'), resolution='failed', note='<b>n</b>', confirm='yes'))
    assert status == 200 and data.status('billing.charge', key) == 'failed'


def test_a_hash_keys_scope_is_searched_by_digest_never_shown_in_clear(data, console, person):
    data.unknown('signup.mail', ['carol@example.com', 'dave@example.com'])
    digest = data.one("SELECT idempo.stored_key('signup.mail', 'carol@example.com')")[0]
    p = person(console()).sign_in('alice')
    _, body, _, _ = p.get('/unknown?' + urllib.parse.urlencode({'q': 'carol@example.com'}))
    assert digest in body and 'carol@example.com' not in body
    assert data.one("SELECT idempo.stored_key('signup.mail', 'dave@example.com')")[0] not in body
    _, body, _, _ = p.get(record_path('signup.mail', digest))
    assert 'carol@example.com' not in body
    form = p.form(body, 'resolve')
    status, body, _, _ = p.post('/decide', dict(form, clear_key='dave@example.com', resolution='failed', note='n',
                                                 confirm='yes'))
    assert status == 422 and 'does not hash to this record' in body
    status, body, _, _ = p.post('/decide', dict(form, clear_key='carol@example.com', resolution='failed', note='n',
                                                 confirm='yes'))
    assert status == 200 and 'carol@example.com' not in body
    assert data.status('signup.mail', digest) == 'failed'


def test_queues_page_by_keyset(data, console, person):
    keys = [f'inv-{i:03}' for i in range(120)]
    data.unknown('billing.charge', keys)
    p = person(console()).sign_in('alice')
    seen, path = [], '/unknown?scope=billing.charge'
    while path:
        _, body, _, _ = p.get(path)
        seen += re.findall(r'class="key" href="[^"]+">(inv-\d+)</a>', body)
        m = re.search(r'<a href="([^"]+)" rel="next">', body)
        path = m and m.group(1).replace('&amp;', '&')
    assert sorted(seen) == keys and len(seen) == 120


def test_read_only_offers_and_takes_no_decision(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    p = person(console('--read-only')).sign_in('alice')
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    assert '/decide' not in body
    csrf = re.search(r'name="csrf" value="([^"]+)"', body).group(1)
    status, body, _, _ = p.post('/decide', {'csrf': csrf, 'action': 'resolve', 'scope': 'billing.charge', 'key': 'inv-1',
                                            'resolution': 'failed', 'note': 'n', 'confirm': 'yes', 'token': ''})
    assert status == 403 and data.status('billing.charge', 'inv-1') == 'unknown'


def test_a_change_committed_while_deciding_is_refused(data, console, person):
    """The record changes after the console compared it with the page and before idempo's
    function locks it: the function's lock meets a row changed after the transaction's snapshot
    and the decision is refused as stale (under READ COMMITTED it would decide on the new attempt)."""
    data.unknown('billing.charge', ['inv-1'])
    c = console()
    alice = person(c).sign_in('alice')
    _, page, _, _ = alice.get(record_path('billing.charge', 'inv-1'))
    with psycopg.connect(dbname=data.dbname) as other:      # carol's transaction, kept open
        other.execute("SELECT idempo.resolve('billing.charge', 'inv-1', 'not_executed', 'carol', note => 'no')")
        other.execute("SELECT idempo.claim('billing.charge', 'inv-1', params => '{\"amount\": 10}')")
        other.execute("SET LOCAL idempo.clock_offset = '30 minutes'")
        other.execute('SELECT idempo.sweep(100000)')
        answer = {}
        t = threading.Thread(target=lambda: answer.update(r=alice.post('/decide', dict(
            alice.form(page, 'resolve'), resolution='succeeded', target_ref='ch_1', note='found', confirm='yes'))))
        t.start()
        # the console's transaction waits for the record's lock: then carol commits
        deadline = time.monotonic() + 60
        while not data.one("""SELECT 1 FROM pg_stat_activity WHERE application_name = 'idempo console'
                                 AND wait_event_type = 'Lock'"""):
            assert time.monotonic() < deadline and t.is_alive(), f'the decision did not wait for the lock: {answer}'
            time.sleep(0.02)
        other.commit()
    t.join(60)
    status, body, _, _ = answer['r']
    assert status == 409 and 'changed while you decided' in body
    assert data.status('billing.charge', 'inv-1') == 'unknown'
    assert data.one("SELECT attempt FROM idempo.operations WHERE key = 'inv-1'")[0] == 2


def test_decide_fifty_at_once_with_one_changed_meanwhile(data, console, person):
    keys = [f'inv-{i:02}' for i in range(50)]
    data.unknown('billing.charge', keys)
    p = person(console()).sign_in('alice')
    _, page, _, _ = p.get('/unknown?scope=billing.charge')
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    picks = [html.unescape(v) for v in re.findall(r'name="pick" id="pick-\d+" value=\'([^\']*)\'', page)]
    assert len(picks) == 50
    # the selection, counted and sampled, before anything is decided
    status, body, _, _ = p.post('/bulk', {'csrf': csrf, 'step': 'review', 'resolution': 'not_executed', 'pick': picks},
                                doseq=True)
    assert status == 200 and '50 record(s) selected' in body and 'inv-00' in body and 'and 40 more' in body
    assert data.one("SELECT count(*) FROM idempo.operations WHERE status = 'unknown'")[0] == 50
    confirm = [html.unescape(v) for v in re.findall(r'name="pick" value=\'([^\']*)\'', body)]
    assert sorted(confirm) == sorted(picks)
    # meanwhile carol decides one of them
    data.sql("SELECT idempo.resolve('billing.charge', 'inv-07', 'failed', 'carol', note => 'declined')", user='carol')
    status, body, _, _ = p.post('/bulk', {'csrf': csrf, 'step': 'decide', 'resolution': 'not_executed',
                                          'note': 'none reached the provider', 'confirm': 'yes', 'pick': confirm},
                                doseq=True)
    assert status == 200 and '49 record(s) resolved as not_executed; 1 refused, not forced' in body
    refused = re.search(r'<table id="refused">(.*?)</table>', body, re.S).group(1)
    assert 'inv-07' in refused and 'changed since you read it' in refused and 'inv-08' not in refused
    assert data.sql("SELECT status::text, count(*) FROM idempo.operations GROUP BY 1 ORDER BY 1") == \
        [('failed', 1), ('retryable', 49)]
    assert data.one("SELECT resolved_by FROM idempo.reviews WHERE key = 'inv-07'") is None   # (no review: unknown)
    assert data.one("SELECT count(*) FROM idempo.events WHERE action = 'resolve' AND actor = 'alice'")[0] == 49


def test_decide_many_refuses_what_the_role_may_not_see(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    data.unknown('shop.order', ['order-1'])
    c = console()
    alice, bob = person(c).sign_in('alice'), person(c).sign_in('bob')
    _, page, _, _ = alice.get('/unknown?scope=billing.charge')
    pick = html.unescape(re.search(r'name="pick" id="pick-\d+" value=\'([^\']*)\'', page).group(1))
    _, own, _, _ = bob.get('/unknown')
    csrf = re.search(r'name="csrf" value="([^"]+)"', own).group(1)
    status, body, _, _ = bob.post('/bulk', {'csrf': csrf, 'step': 'decide', 'resolution': 'failed', 'note': 'x',
                                            'confirm': 'yes', 'pick': [pick]}, doseq=True)
    assert '0 record(s) resolved' in body and 'no such record' in body
    assert data.status('billing.charge', 'inv-1') == 'unknown'


def test_hand_made_links_are_answered_not_crashed(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    p = person(console()).sign_in('alice')
    for path in ('/reviews?after=2020-01-01T00:00:00%2B00:00|x', '/unknown?older_than=99999999999999999',
                 '/unknown?after=nonsense', '/record?scope=&key=', '/scopes/%3Cscript%3E'):
        status, body, _, _ = p.get(path)
        assert status in (200, 400, 404), (path, status)
        assert '<script>' not in body


def test_request_review_and_release(data, console, person):
    data.sql("""SELECT idempo.create_scope('billing.refund', allowed_role => 'console_billing_app', review_role => 'console_billing_reviewers', audit => true,
                retention => '2 seconds', lease => '1 second', verify_settle => '1 second', remember => '1 day')""")
    data.sql("SELECT idempo.claim('billing.charge', 'inv-1', complete_on_commit => true)")
    data.sql("SELECT idempo.claim('billing.refund', 'ref-1', complete_on_commit => true)")
    p = person(console()).sign_in('alice')
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    assert 'id="release-submit"' not in body       # not remembered: nothing to release
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'request_review'), note='the customer disputes it',
                                                 confirm='yes'))
    assert status == 200 and 'Put in review' in body and data.status('billing.charge', 'inv-1') == 'in_review'
    assert data.one("SELECT reason, detail FROM idempo.reviews WHERE key = 'inv-1'") == ('manual', 'the customer disputes it')
    # a remembered key: its result expired (2 seconds of retention), its record kept for a day
    deadline = time.monotonic() + 30
    while not data.one("SELECT expires_at <= idempo.now() FROM idempo.operations WHERE key = 'ref-1'")[0]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    _, body, _, _ = p.get(record_path('billing.refund', 'ref-1'))
    assert 'id="review-submit"' not in body
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'release'), note='the refund must run again', confirm='yes'))
    assert status == 200 and 'Released' in body, body
    assert data.status('billing.refund', 'ref-1') is None
    assert data.one("SELECT resolution, resolved_by, note FROM idempo.reviews WHERE key = 'ref-1'") == \
        ('released', 'alice', 'the refund must run again')


# ---- the fences of the outside review ----

def test_a_sign_in_the_server_did_not_check_is_refused(data, console, person):
    """pg_hba trusts postgres here (as a peer or trust line would): the connection opens whatever
    the password; the console must not take that for a checked password."""
    c = console()
    p = person(c)
    status, body, headers, _ = p.post('/login', p.login_form('postgres', 'wrong'), follow=False)
    assert status == 401 and 'Sign-in failed: that role and password were not accepted.' in body
    assert 'idempo_console=' not in (headers.get('Set-Cookie') or '')
    assert 'did not ask for the password' in c.logs() and 'postgres' not in c.logs() and 'wrong' not in c.logs()


def test_a_superuser_is_refused(data, console, person):
    """A superuser is a member of every role: the console's scope rule would not hold for them."""
    data.sql("""DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_root') THEN
                  CREATE ROLE console_root SUPERUSER LOGIN PASSWORD 'root-pw'; END IF; END $$""")
    c = console()
    p = person(c)
    status, body, _, _ = p.post('/login', p.login_form('console_root', 'root-pw'))
    assert status == 401 and 'Sign-in failed: that role and password were not accepted.' in body
    assert 'a superuser' in c.logs() and 'console_root' not in c.logs()


LONG = 'console_' + 'l' * 55      # 63 bytes: what PostgreSQL keeps of a longer login name


def test_the_reviewer_is_the_servers_name_for_the_session(data, console, person):
    assert len(LONG) == 63
    data.sql(f"""DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{LONG}') THEN
                   CREATE ROLE {LONG} LOGIN PASSWORD 'long-pw' IN ROLE console_reviewer, console_billing_reviewers;
                 END IF; END $$""")
    data.unknown('billing.charge', ['inv-1'])
    data.sql("SELECT idempo.request_review('billing.charge', 'inv-1', 'the customer asks')")
    p = person(console())
    typed = LONG + ' (as bob)'
    status, body, _, _ = p.post('/login', p.login_form(typed, 'long-pw'))
    assert status == 200 and f'<strong id="whoami">{LONG}</strong>' in body and '(as bob)' not in body
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'resolve'), resolution='failed', note='n', confirm='yes'))
    assert status == 200 and 'Resolved as failed' in body
    assert data.one("SELECT resolved_by FROM idempo.reviews WHERE key = 'inv-1'")[0] == LONG


def raw_http(console, head, body=b'', wait=10):
    """Sends bytes as they are; the first line of the answer (None: no answer in `wait` seconds)."""
    import socket
    with socket.create_connection(('127.0.0.1', console.port), timeout=wait) as s:
        s.sendall(head + body)
        try:
            return s.recv(200).split(b'\r\n')[0].decode()
        except socket.timeout:
            return None


def test_a_body_over_the_limit_is_refused_before_it_is_read(data, console, person):
    c = console()
    # announced too long: answered at once, before any of it is sent
    line = raw_http(c, b'POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n'
                       b'Content-Length: %d\r\n\r\n' % (300 << 20))
    assert line is not None and ' 413 ' in line, line


def test_a_chunked_body_is_cut_at_the_limit(data, console, person):
    """No Content-Length: reading stops past the limit (the rest is never sent here)."""
    c = console()
    chunk = b'a' * 65536
    body = (b'%x\r\n' % len(chunk) + chunk + b'\r\n') * 20      # 1.25 MiB, and no last chunk
    line = raw_http(c, b'POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n'
                       b'Transfer-Encoding: chunked\r\n\r\n', body)
    assert line is not None and ' 413 ' in line, line


def test_a_newline_in_the_path_does_not_forge_a_log_line(data, console, person):
    c = console()
    raw_http(c, b'GET /nothing%0A2026-12-05%2002:00:00,000%20idempo.console%20POST%20/decide%20303 HTTP/1.1\r\n'
                b'Host: x\r\nConnection: close\r\n\r\n')
    lines = c.logs().splitlines()
    assert not any(line.startswith('2026-12-05 02:00:00,000') for line in lines), c.logs()
    assert any('/nothing%0A2026' in line for line in lines), c.logs()


def test_bad_input_is_answered_400_and_not_logged(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    c = console()
    p = person(c).sign_in('alice')
    q = urllib.parse.quote
    for path in ('/unknown?older_than=' + q('\u00b2'), '/reviews?after=' + q('2020-01-01T00:00:00|\u0663'),
                 '/reviews?after=' + q('2020-01-01T00:00:00|99999999999999999999999'),
                 '/conflicts?after=' + q('2020-01-01T00:00:00|-99999999999999999999999'),
                 '/unknown?after=' + q('2020-01-01T00:00:00|sc|k\x00x'), '/record?scope=billing.charge&key=' + q('k\x00x')):
        status, body, _, _ = p.get(path)
        assert status == 400 and 'Not understood' in body, (path, status)
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'resolve'), csrf='\u00e9', resolution='failed', note='n',
                                                 confirm='yes'))
    assert status == 403 and data.status('billing.charge', 'inv-1') == 'unknown'
    log = c.logs()
    assert 'Traceback' not in log and '99999999999999999999999' not in log, log


def test_a_sign_in_from_another_site_is_refused(data, console, person):
    c = console()
    p = person(c)
    # no pre-session token: the form was not the console's sign-in page
    status, _, headers, _ = p.post('/login', {'role': 'alice', 'password': 'alice-pw'}, follow=False)
    assert status == 403 and 'idempo_console=' not in (headers.get('Set-Cookie') or '')
    # the token's field without its cookie (another browser's page)
    form = p.login_form('alice', 'alice-pw')
    other = person(c)
    status, _, headers, _ = other.post('/login', form, follow=False)
    assert status == 403
    # a cross-site request carrying the token anyway: its Origin or Sec-Fetch-Site says so
    for h in ({'Origin': 'https://evil.example'}, {'Sec-Fetch-Site': 'cross-site'}):
        req = urllib.request.Request(c.url + '/login', urllib.parse.urlencode(form).encode(), headers=h)
        try:
            status = p.raw.open(req, timeout=30).status
        except urllib.error.HTTPError as e:
            status = e.code
        assert status == 403, h
    # what a browser sends from the console's own page (its Referrer-Policy makes Origin null)
    req = urllib.request.Request(c.url + '/login', urllib.parse.urlencode(form).encode(),
                                 headers={'Origin': 'null', 'Sec-Fetch-Site': 'same-origin'})
    try:
        r = p.raw.open(req, timeout=30)
        status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    assert status == 303
    _, body, _, _ = p.get('/')
    assert '<strong id="whoami">alice</strong>' in body


def test_the_done_box_shows_only_what_the_console_said(data, console, person):
    data.unknown('billing.charge', ['inv-1', 'inv-2'])
    p = person(console()).sign_in('alice')
    status, body, _, _ = p.get(record_path('billing.charge', 'inv-1') + '&done=' +
                               urllib.parse.quote('Session expired: sign in again at https://evil.example'))
    assert status == 200 and 'evil.example' not in body and 'id="done"' not in body
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    status, body, _, url = p.post('/decide', dict(p.form(body, 'resolve'), resolution='failed', note='n', confirm='yes'))
    assert status == 200 and 'Resolved as failed' in re.search(r'id="done">([^<]*)', body).group(1)
    assert 'done=' not in url
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))     # said once
    assert 'id="done"' not in body


def test_a_change_to_a_row_the_decision_does_not_lock_is_refused(data, console, person):
    """resolve_conflict() locks only the conflict: the record put in review by another caller
    (READ COMMITTED) after the decision's snapshot and before the call is not met by a lock. The
    decision's reads are held up by a lock on idempo.events (its history) to commit the change
    in that window; the decision must still be refused as stale."""
    data.sql("""SELECT idempo.create_scope('billing.refund', allowed_role => 'console_billing_app', review_role => 'console_billing_reviewers',
                store_params => true, lease => '1 minute')""")      # no audit: the change writes no event
    cid = data.conflict('billing.refund', 'ref-1', {'amount': 1}, {'amount': 2})
    c = console()
    alice = person(c).sign_in('alice')
    _, page, _, _ = alice.get(record_path('billing.refund', 'ref-1'))
    assert '<dd id="status">succeeded</dd>' in page
    with psycopg.connect(dbname=data.dbname) as lock:
        lock.execute('LOCK TABLE idempo.events IN ACCESS EXCLUSIVE MODE')
        answer = {}
        t = threading.Thread(target=lambda: answer.update(r=alice.post('/decide', dict(
            alice.form(page, 'resolve_conflict'), resolution='kept_stored', note='stored stands', confirm='yes'))))
        t.start()
        deadline = time.monotonic() + 60
        while not data.one("""SELECT 1 FROM pg_stat_activity WHERE application_name = 'idempo console'
                                 AND wait_event_type = 'Lock'"""):
            assert time.monotonic() < deadline and t.is_alive(), f'the decision did not wait for the lock: {answer}'
            time.sleep(0.02)
        data.sql("SELECT idempo.request_review('billing.refund', 'ref-1', 'a person must look at this')")
        lock.rollback()
    t.join(60)
    status, body, _, _ = answer['r']
    assert status == 409 and 'changed while you decided' in body, (status, text_of(body)[:300])
    assert '<dd id="status">in_review</dd>' in body
    assert data.one('SELECT resolved_at FROM idempo.conflicts WHERE id = %s', (cid,))[0] is None


# ---- single sign-on: a trusted proxy's header mapped to a role ----

PROXY = '127.0.0.2'      # the proxy of --sso-trust: the tests connect from it, or from 127.0.0.1
HEADER = 'X-Forwarded-User'


def sso_console(console, *more):
    """The console behind a proxy at PROXY, connected as its own role console_sso."""
    return console('--sso-header', HEADER, '--sso-trust', PROXY, '--sso-group', 'console_reviewer', *more,
                   dsn_extra=' user=console_sso password=console-sso-pw')


def whoami(body):
    m = re.search(r'<strong id="whoami">([^<]*)</strong>', body)
    return m and html.unescape(m.group(1))


def test_the_trusted_peer_and_the_mapping_rule():
    from idempo.console.app import peer_trusted, sso_role
    import ipaddress
    nets = (ipaddress.ip_network('127.0.0.2'), ipaddress.ip_network('10.1.0.0/16'))
    assert peer_trusted('127.0.0.2', nets) and peer_trusted('10.1.200.3', nets)
    assert peer_trusted('::ffff:127.0.0.2', nets)               # an IPv4 peer on a dual-stack socket
    for peer in ('127.0.0.1', '10.2.0.1', '::1', None, '', 'proxy.example'):
        assert not peer_trusted(peer, nets), peer
    assert sso_role('Rita') == 'Rita' and sso_role('Rita', 'lower') == 'rita'
    assert sso_role('Rita.Smith@Example.COM', 'local-part', 'example.com') == 'rita.smith'
    for value, how in (('rita@evil.example', 'local-part'), ('rita', 'local-part'), ('a@b@example.com', 'local-part'),
                       ('', 'exact'), ('r' * 64, 'exact'), ('é' * 32, 'exact'), ('rita\x01', 'exact')):
        assert sso_role(value, how, 'example.com') is None, value
    assert sso_role('é' * 31) == 'é' * 31                       # 62 bytes: a role name


def test_sso_signs_in_as_the_mapped_role_and_records_it(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    data.sql("SELECT idempo.request_review('billing.charge', 'inv-1', 'the customer asks')")
    c = sso_console(console, '--sso-map', 'local-part', '--sso-domain', 'example.com')
    p = person(c, source=PROXY, headers={HEADER: 'Alice@example.com'})
    status, body, headers, _ = p.get('/')
    assert status == 200 and whoami(body) == 'alice', body
    assert 'type="password"' not in body
    _, body, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    status, body, _, _ = p.post('/decide', dict(p.form(body, 'resolve'), resolution='failed', note='declined',
                                                 confirm='yes'))
    assert status == 200 and 'Resolved as failed' in body, body
    # the database saw alice as the role in effect; the console's own role made the connection
    assert data.one("SELECT actor FROM idempo.events WHERE action = 'resolve'")[0] == 'alice'
    assert data.one("SELECT resolved_by FROM idempo.reviews WHERE key = 'inv-1'")[0] == 'alice'
    # no password form: a password sign-in is not taken
    status, body, _, _ = person(c, source=PROXY).post('/login', {'role': 'bob', 'password': 'bob-pw'})
    assert status == 401 and 'type="password"' not in body and whoami(body) is None
    assert 'alice' not in c.logs() and 'Alice' not in c.logs()


def test_sso_header_from_another_peer_is_ignored(data, console, person):
    c = sso_console(console)
    # straight to the console, not through the proxy: the header is the sender's word only
    status, body, _, _ = person(c, headers={HEADER: 'alice'}).get('/')
    assert status == 401 and whoami(body) is None and 'not signed in' in body
    assert f'the single sign-on header {HEADER} from 127.0.0.1 ignored' in c.logs() and 'alice' not in c.logs()
    # a session opened through the proxy does not open pages from elsewhere
    p = person(c, source=PROXY, headers={HEADER: 'alice'})
    assert whoami(p.get('/')[1]) == 'alice'
    other = person(c, headers={HEADER: 'alice'})
    other.jar = p.jar
    other.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(p.jar))
    status, body, _, _ = other.get('/')
    assert status == 401 and whoami(body) is None


def test_sso_refuses_a_role_outside_the_group_a_superuser_and_no_role(data, console, person):
    c = sso_console(console)
    for value in ('console_outsider', 'console_sso_root', 'console_reviewer', 'console_sso', 'nobody',
                  'Alice', 'a' * 64):
        status, body, headers, _ = person(c, source=PROXY, headers={HEADER: value}).get('/')
        assert status == 401 and whoami(body) is None and 'not signed in' in body, value
        assert 'idempo_console=' not in (headers.get('Set-Cookie') or ''), value
    logs = c.logs()
    assert 'not a member of the --sso-group role' in logs and 'a superuser' in logs and 'no such role' in logs
    assert 'console_outsider' not in logs and 'console_sso_root' not in logs and 'nobody' not in logs
    # the reviewers themselves still sign in
    assert whoami(person(c, source=PROXY, headers={HEADER: 'carol'}).get('/')[1]) == 'carol'


def test_sso_a_changed_header_ends_the_session(data, console, person):
    data.unknown('billing.charge', ['inv-1'])
    c = sso_console(console)
    p = person(c, source=PROXY, headers={HEADER: 'alice'})
    _, page, _, _ = p.get(record_path('billing.charge', 'inv-1'))
    form = p.form(page, 'resolve')
    # the proxy now names bob on the same browser: alice's session is over, its token with it
    p.headers[HEADER] = 'bob'
    status, body, _, _ = p.post('/decide', dict(form, resolution='failed', note='n', confirm='yes'))
    assert status == 403 and data.status('billing.charge', 'inv-1') == 'unknown'
    status, body, _, _ = p.get('/')
    assert status == 200 and whoami(body) == 'bob'
    # alice again: a new session, not the old one
    p.headers[HEADER] = 'alice'
    status, body, _, _ = p.post('/decide', dict(form, resolution='failed', note='n', confirm='yes'))
    assert status == 403 and data.status('billing.charge', 'inv-1') == 'unknown'
    # no header from the proxy: not signed in
    del p.headers[HEADER]
    status, body, _, _ = p.get('/')
    assert status == 401 and whoami(body) is None


def test_sso_refuses_to_start_as_a_superuser(data):
    import os
    import subprocess
    import sys
    dsn = f"dbname={data.dbname} host={os.environ.get('PGHOST', '')} port={os.environ.get('PGPORT', '5432')} user=postgres"
    r = subprocess.run([sys.executable, '-m', 'idempo.console', '--dsn', dsn, '--listen', '127.0.0.1:1',
                        '--sso-header', HEADER, '--sso-trust', PROXY, '--sso-group', 'console_reviewer'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'is a superuser or has CREATEROLE or BYPASSRLS' in r.stderr, r.stderr


# ---- failed sign-ins are limited ----

def test_failed_sign_ins_are_limited_per_address_and_per_role(data, console, person):
    c = console()
    p = person(c)
    for i in range(10):
        status, _, headers, _ = p.post('/login', p.login_form('alice', f'wrong-{i}'))
        assert status == 401 and 'Retry-After' not in headers, i
    # the eleventh is not tried, even with the right password
    status, body, headers, _ = p.post('/login', p.login_form('alice', 'alice-pw'))
    assert status == 429 and 'Too many failed sign-ins' in body and whoami(body) is None
    assert 1 <= int(headers['Retry-After']) <= 900
    # the limit of the role name holds from any address; the address's for any role name
    elsewhere = person(c, source='127.0.0.3')
    status, _, _, _ = elsewhere.post('/login', elsewhere.login_form('alice', 'alice-pw'))
    assert status == 429
    status, _, _, _ = p.post('/login', p.login_form('bob', 'bob-pw'))
    assert status == 429
    # another address and another role: unaffected
    elsewhere.sign_in('bob')
    logs = c.logs()
    assert 'sign-in refused without trying' in logs
    assert 'alice' not in logs and 'wrong-' not in logs and 'bob' not in logs


def test_the_role_name_is_limited_as_the_server_cuts_it(data, console, person):
    """PostgreSQL keeps 63 bytes of a login name: names that differ after them are one role, and
    count as one, from any address."""
    c = console()
    for i in range(10):
        p = person(c, source=f'127.0.0.{10 + i}')
        status, _, _, _ = p.post('/login', p.login_form(f'{LONG} {i}', 'wrong'))
        assert status == 401, i
    p = person(c, source='127.0.0.30')
    status, _, _, _ = p.post('/login', p.login_form(LONG, 'long-pw'))
    assert status == 429


def activity_row(body, label):
    """The (per-day counts, total, today) the overview's last-days table shows for one line."""
    m = re.search(r'<th scope="row">' + re.escape(label) + r'</th>\s*<td><svg[^>]*aria-label="[^"]*: ([0-9, ]+)">'
                  r'.*?</svg></td>\s*<td>(\d+)</td><td>(\d+)</td>', body, re.S)
    assert m, f'no line {label!r} in the overview'
    return [int(n) for n in m.group(1).split(', ')], int(m.group(2)), int(m.group(3))


def test_the_overview_charts_the_last_days_of_the_scopes_one_reviews(data, console, person):
    # billing (alice reviews it): 3 new keys, 1 replay, 1 conflict, 1 put in review, 1 resolved;
    # the shop (bob's): 2 new keys, and a day three days ago of 4 more
    for k in ('inv-1', 'inv-2', 'inv-3'):
        data.sql("SELECT idempo.claim('billing.charge', %s, '{\"amount\": 1}', complete_on_commit => true)", (k,))
    data.sql("""SELECT idempo.claim('billing.charge', 'inv-1', '{"amount": 1}')""")
    data.sql("""SELECT idempo.claim('billing.charge', 'inv-1', '{"amount": 2}')""")
    data.sql("SELECT idempo.request_review('billing.charge', 'inv-2', 'look')")
    data.sql("SELECT idempo.resolve('billing.charge', 'inv-2', 'failed', note => 'refunded by hand')")
    for k in ('order-1', 'order-2'):
        data.sql("SELECT idempo.claim('shop.order', %s, complete_on_commit => true)", (k,))
    data.sql("SET idempo.clock_offset = '-3 days'; SELECT idempo.claim('shop.order', k, complete_on_commit => true) "
             "FROM unnest(ARRAY['old-1', 'old-2', 'old-3', 'old-4']) k")
    c = console()
    _, body, _, _ = person(c).sign_in('alice').get('/')
    assert activity_row(body, 'claims that ran the action') == ([0] * 13 + [3], 3, 3)
    assert activity_row(body, 'replays')[1:] == (1, 1)
    assert activity_row(body, 'conflicts')[1:] == (1, 1)
    assert activity_row(body, 'records into review')[1:] == (1, 1)
    assert activity_row(body, 'verified, resolved or released')[1:] == (1, 1)
    _, body, _, _ = person(c).sign_in('bob').get('/')
    assert activity_row(body, 'claims that ran the action') == ([0] * 10 + [4, 0, 0, 2], 6, 2)
    assert activity_row(body, 'conflicts')[1:] == (0, 0)


def console_backends(data, role):
    return data.one("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND application_name = 'idempo console'",
                    (role,))[0]


def test_a_persons_connection_is_kept_between_pages_and_renewed(data, console, person):
    c = console('--reconnect-seconds', '2')
    alice = person(c).sign_in('alice')
    for _ in range(5):
        assert alice.get('/unknown')[0] == 200
    # one connection serves her pages (opening one per page costs more than the page's queries)
    assert console_backends(data, 'alice') == 1
    # and is closed when she has not come back for that long: an idle console holds none
    deadline = time.monotonic() + 20
    while console_backends(data, 'alice') != 0:
        assert time.monotonic() < deadline, 'an idle person keeps a connection'
        time.sleep(0.1)
    assert alice.get('/unknown')[0] == 200 and console_backends(data, 'alice') == 1
    # what PostgreSQL checks when a connection opens is checked again once the kept one is old
    data.sql("ALTER ROLE alice NOLOGIN")
    try:
        deadline = time.monotonic() + 20
        while True:
            status, _, _, url = alice.get('/unknown')
            if url.endswith('/login'):
                break
            assert status == 200 and time.monotonic() < deadline, 'a revoked LOGIN still reads pages'
            time.sleep(0.1)
    finally:
        data.sql("ALTER ROLE alice LOGIN")
    assert console_backends(data, 'alice') == 0


# ---- every record a filter matches, beyond the page ----

def hidden_fields(body, form_id):
    """The hidden fields of the page's form with this id."""
    form = re.search(rf'<form method="post" action="[^"]+" id="{form_id}">(.*?)</form>', body, re.S).group(1)
    return {html.unescape(n): html.unescape(v)
            for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form)}


def run_to_the_end(p, body):
    """Follows a run's progress pages (their refresh, as a browser does) to its last page; the
    pages seen on the way."""
    seen = []
    for _ in range(200):
        m = re.search(r'<meta http-equiv="refresh" content="0; url=([^"]+)">', body)
        if not m:
            return body, seen
        seen.append(body)
        status, body, _, _ = p.get(html.unescape(m.group(1)))
        assert status == 200, text_of(body)[:300]
    raise AssertionError('the run did not end')


def test_select_all_a_filter_matches_decides_only_what_was_selected(data, console, person):
    data.sql("""SELECT idempo.create_scope('billing.refund', allowed_role => 'console_billing_app', audit => true,
                lease => '1 minute')""")
    keys = [f'inv-{i:03}' for i in range(120)]
    data.unknown('billing.charge', keys)
    data.unknown('billing.refund', ['ref-1', 'ref-2'])          # another scope: the filter leaves them out
    p = person(console()).sign_in('alice')
    _, page, _, _ = p.get('/unknown?scope=billing.charge')
    assert len(re.findall(r'name="pick"', page)) == 50          # a page shows 50; the filter matches 120
    status, body, _, _ = p.post('/bulk/all', hidden_fields(page, 'select-all-form'))
    assert status == 200 and '120 record(s) selected' in text_of(body) and 'At most 10,000' in text_of(body)
    sample = re.findall(r'class="key" href="[^"]+">([^<]+)</a>', re.search(r'<ul id="sample">(.*?)</ul>', body, re.S).group(1))
    assert sample == keys[:20] and 'and 100 more' in body
    assert data.one("SELECT count(*) FROM idempo.operations WHERE status = 'unknown'")[0] == 122   # nothing decided
    start = hidden_fields(body, 'all-form')
    # meanwhile: carol decides one; another is decided and in doubt again (it matches, in another
    # state); a new record starts to match
    data.sql("SELECT idempo.resolve('billing.charge', 'inv-007', 'failed', 'carol', note => 'declined')", user='carol')
    data.sql("SELECT idempo.resolve('billing.charge', 'inv-008', 'not_executed', 'carol', note => 'retry')", user='carol')
    data.unknown('billing.charge', ['inv-008', 'inv-new'])
    assert data.one("SELECT attempt FROM idempo.operations WHERE key = 'inv-008'")[0] == 2
    status, body, _, _ = p.post('/bulk/run', dict(start, resolution='not_executed', note='the provider was down',
                                                  confirm='yes'))
    assert status == 200 and '98 decided and 2 refused so far; 20 record(s) to go' in text_of(body)
    # its button goes on as its refresh does (here a chunk that is the last one)
    status, body, _, _ = p.post('/bulk/run', hidden_fields(body, 'continue-form'))
    body, progress = run_to_the_end(p, body)
    assert not progress
    assert '118 record(s) resolved as not_executed; 2 refused, not forced' in text_of(body)
    refused = re.search(r'<table id="refused">(.*?)</table>', body, re.S).group(1)
    assert re.findall(r'>(inv-\d+)</a>', refused) == ['inv-007', 'inv-008'] and 'changed since you read it' in refused
    assert data.status('billing.charge', 'inv-007') == 'failed'
    assert data.one("SELECT status::text, attempt FROM idempo.operations WHERE key = 'inv-008'") == ('unknown', 2)
    assert data.status('billing.charge', 'inv-new') == 'unknown'            # it matched only after the selection
    assert [data.status('billing.refund', k) for k in ('ref-1', 'ref-2')] == ['unknown', 'unknown']
    assert data.one("SELECT count(*) FROM idempo.operations WHERE scope = 'billing.charge' AND status = 'retryable'")[0] == 118
    # each decision in its record's history, by alice
    assert data.one("""SELECT count(DISTINCT key) FROM idempo.events WHERE action = 'resolve' AND actor = 'alice'
                       AND to_status = 'retryable'""")[0] == 118
    # the run is over: going back to it decides nothing more
    status, again, _, _ = p.get('/bulk/run?run=' + urllib.parse.quote(start['run']))
    assert '118 record(s) resolved' in text_of(again)
    assert data.status('billing.charge', 'inv-new') == 'unknown'


def test_select_all_needs_a_note_and_the_confirmation_and_is_the_sessions_own(data, console, person):
    data.unknown('billing.charge', ['inv-1', 'inv-2'])
    c = console()
    p, carol = person(c).sign_in('alice'), person(c).sign_in('carol')
    _, page, _, _ = p.get('/unknown')
    _, body, _, _ = p.post('/bulk/all', hidden_fields(page, 'select-all-form'))
    start = hidden_fields(body, 'all-form')
    status, body, _, _ = p.post('/bulk/run', dict(start, resolution='failed', note=' ', confirm='yes'))
    assert status == 422 and 'needs a note' in body
    status, body, _, _ = p.post('/bulk/run', dict(start, resolution='failed', note='n'))
    assert status == 422 and 'confirmation' in body
    status, body, _, _ = p.post('/bulk/run', dict(start, resolution='succeeded', note='n', confirm='yes'))
    assert status == 422
    # another person's session does not know the run (it is kept in alice's session)
    _, own, _, _ = carol.get('/unknown')
    status, body, _, _ = carol.post('/bulk/run', dict(start, csrf=re.search(r'name="csrf" value="([^"]+)"', own).group(1),
                                                      resolution='failed', note='n', confirm='yes'))
    assert status == 404
    status, body, _, _ = carol.get('/bulk/run?run=' + urllib.parse.quote(start['run']))
    assert status == 404
    assert [data.status('billing.charge', k) for k in ('inv-1', 'inv-2')] == ['unknown', 'unknown']
    status, body, _, _ = p.post('/bulk/run', dict(start, resolution='failed', note='n', confirm='yes'))
    assert '2 record(s) resolved as failed' in text_of(body)


def test_select_all_on_the_review_queue_leaves_hash_keys_scopes_out(data, console, person):
    data.unknown('billing.charge', ['inv-1', 'inv-2', 'inv-3'])
    data.unknown('signup.mail', ['carol@example.com'])
    for scope, key in (('billing.charge', 'inv-1'), ('billing.charge', 'inv-2'), ('signup.mail', 'carol@example.com')):
        data.sql('SELECT idempo.request_review(%s, %s, %s)', (scope, key, 'a person must look'))
    p = person(console()).sign_in('alice')
    _, page, _, _ = p.get('/reviews?reason=manual')
    status, body, _, _ = p.post('/bulk/all', hidden_fields(page, 'select-all-form'))
    assert status == 200 and '2 record(s) selected' in text_of(body) and 'reason manual' in text_of(body)
    assert '1 record(s) of hash_keys scopes are not selected' in text_of(body)
    status, body, _, _ = p.post('/bulk/run', dict(hidden_fields(body, 'all-form'), resolution='failed', note='declined',
                                                  confirm='yes'))
    assert '2 record(s) resolved as failed.' in text_of(run_to_the_end(p, body)[0])
    assert data.sql("""SELECT key, resolution, resolved_by, note FROM idempo.reviews WHERE scope = 'billing.charge'
                       ORDER BY key""") == [('inv-1', 'failed', 'alice', 'declined'), ('inv-2', 'failed', 'alice', 'declined')]
    assert data.one("SELECT resolved_at FROM idempo.reviews WHERE scope = 'signup.mail'")[0] is None
    assert data.status('billing.charge', 'inv-3') == 'unknown'


def test_select_all_stops_at_ten_thousand(data, console, person):
    with psycopg.connect(dbname=data.dbname, autocommit=True) as c:
        c.execute("""SELECT idempo.claim('billing.charge', 'k-' || pg_catalog.lpad(g::text, 5, '0'))
                     FROM pg_catalog.generate_series(1, 10001) AS g""")
        c.execute("SET idempo.clock_offset = '10 minutes'")
        c.execute('SELECT idempo.sweep(100000)')
    p = person(console()).sign_in('alice')
    _, page, _, _ = p.get('/unknown')
    status, body, _, _ = p.post('/bulk/all', hidden_fields(page, 'select-all-form'))
    assert status == 200 and '10000 record(s) selected: more than 10,000 match, the 10,000 oldest are selected' \
        in text_of(body)
    assert 'and 9980 more record(s)' in text_of(body)


def test_close_many_conflicts_at_once(data, console, person):
    data.sql("""SELECT idempo.create_scope('billing.refund', allowed_role => 'console_billing_app', store_params => true,
                audit => true, lease => '1 minute')""")
    cids = {k: data.conflict('billing.charge', k, {'amount': 10}, {'amount': 12}) for k in ('c-1', 'c-2', 'c-3', 'c-4')}
    other = data.conflict('billing.refund', 'r-1', {'amount': 1}, {'amount': 2})
    c = console()
    p = person(c).sign_in('alice')
    # ticked on the page: one occurs again meanwhile
    _, page, _, _ = p.get('/conflicts?scope=billing.charge')
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    picks = {json_key(v): v for v in (html.unescape(v) for v in re.findall(r'name="pick" id="pick-\d+" value=\'([^\']*)\'', page))}
    assert sorted(picks) == ['c-1', 'c-2', 'c-3', 'c-4']
    status, body, _, _ = p.post('/bulk', {'csrf': csrf, 'step': 'review', 'resolution': 'kept_stored',
                                          'pick': [picks['c-1'], picks['c-2']]}, doseq=True)
    assert status == 200 and '2 conflict(s) selected' in body
    confirm = [html.unescape(v) for v in re.findall(r'name="pick" value=\'([^\']*)\'', body)]
    data.conflict_again('billing.charge', 'c-2', {'amount': 12})
    status, body, _, _ = p.post('/bulk', {'csrf': csrf, 'step': 'decide', 'resolution': 'kept_stored', 'note': 'stored stands',
                                          'confirm': 'yes', 'pick': confirm}, doseq=True)
    assert '1 conflict(s) resolved as kept_stored; 1 refused, not forced' in text_of(body), text_of(body)[:500]
    refused = re.search(r'<table id="refused">(.*?)</table>', body, re.S).group(1)
    assert 'c-2' in refused and 'c-1' not in refused and 'changed since you read it' in refused
    assert data.one('SELECT resolution, resolved_by, note FROM idempo.conflicts WHERE id = %s', (cids['c-1'],)) == \
        ('kept_stored', 'alice', 'stored stands')
    assert data.one('SELECT resolved_at FROM idempo.conflicts WHERE id = %s', (cids['c-2'],))[0] is None
    # every conflict the filter matches: c-2, c-3, c-4; meanwhile carol closes c-3 and c-5 occurs
    _, page, _, _ = p.get('/conflicts?scope=billing.charge')
    status, body, _, _ = p.post('/bulk/all', hidden_fields(page, 'select-all-form'))
    assert status == 200 and '3 conflict(s) selected' in text_of(body)
    start = hidden_fields(body, 'all-form')
    data.sql('SELECT idempo.resolve_conflict(%s, %s, %s, %s)', (cids['c-3'], 'dismissed', 'carol', 'dup'), user='carol')
    c5 = data.conflict('billing.charge', 'c-5', {'amount': 10}, {'amount': 12})
    status, body, _, _ = p.post('/bulk/run', dict(start, resolution='dismissed', note='test traffic', confirm='yes'))
    body, _ = run_to_the_end(p, body)
    assert '2 conflict(s) resolved as dismissed; 1 refused, not forced' in text_of(body), text_of(body)[:500]
    refused = re.search(r'<table id="refused">(.*?)</table>', body, re.S).group(1)
    assert 'c-3' in refused and 'changed since you read it' in refused
    assert data.sql('SELECT key, resolution, resolved_by FROM idempo.conflicts ORDER BY key') == [
        ('c-1', 'kept_stored', 'alice'), ('c-2', 'dismissed', 'alice'), ('c-3', 'dismissed', 'carol'),
        ('c-4', 'dismissed', 'alice'), ('c-5', None, None), ('r-1', None, None)]
    assert c5 and other


def json_key(pick):
    return json.loads(pick)[1]
