#!/usr/bin/env python3
"""Mutants of the Python library: plausible one-line slips at the lines that make it correct,
each with the tests that must fail on it (as test/mutation does for the C code, which has no
runner for Python).  Each mutant is applied to a copy of clients/python, its tests run there
against the server libpq's variables name; a mutant whose tests pass "survived" and fails this
run.  A pattern that no longer matches exactly once is STALE and fails too.

usage: tests/mutants.py [ID...]         (from clients/python; prints "N passed, N failed")
"""
import os
import shutil
import subprocess
import sys
import tempfile

MUTANTS = [
    # the review console (idempo/console): the fences between a person and a wrong decision
    ('console-every-scope-visible', "the console lists every scope to every reviewer: a reviewer of the shop sees "
     "billing's counts on the overview (idempo's reader functions hide billing's records themselves)",
     'idempo/console/db.py', 'VISIBLE = "idempo.may_review(s.review_role, s.allowed_role)"', 'VISIBLE = "true"',
     'console_tests/test_console_http.py::test_a_role_sees_and_decides_nothing_of_other_scopes'),
    ('console-conn-never-renewed', "a person's kept connection is never opened anew: a LOGIN revoked (a password "
     "changed) keeps reading and deciding for as long as the session lives",
     'idempo/console/app.py', 'time.monotonic() - s.conn_opened > settings.reconnect_seconds', 'False',
     'console_tests/test_console_http.py::test_a_persons_connection_is_kept_between_pages_and_renewed'),
    ('console-conn-never-closed-idle', "a person's kept connection stays open while they are away: an idle console "
     "holds a server connection per person until their session ends",
     'idempo/console/app.py', 'if s.conn is not None and now - s.seen > self.settings.reconnect_seconds',
     'if False and s.conn is not None and now - s.seen > self.settings.reconnect_seconds',
     'console_tests/test_console_http.py::test_a_persons_connection_is_kept_between_pages_and_renewed'),
    ('console-stale-page-decided', 'a decision taken on a page that went stale is made on the record as it is now',
     'idempo/console/db.py', "            if rec['token'] != token:", "            if False:",
     'console_tests/test_console_http.py::test_a_stale_page_is_refused_and_shows_the_new_state'),
    ('console-reviewer-typed', 'the reviewer recorded is a name the form sends, not the signed-in role',
     'idempo/console/app.py', "db.decide(conn, s.role, scope, key,", "db.decide(conn, form.get('reviewer') or s.role, scope, key,",
     'console_tests/test_console_http.py::test_resolve_records_the_signed_in_person'),
    ('console-bulk-forced', 'deciding many at once resolves a record that changed after it was selected',
     'idempo/console/db.py', "            decide(conn, person, scope_name, key, token, 'resolve', note, {'resolution': resolution}, committed)",
     "            decide(conn, person, scope_name, key, (record(conn, scope_name, key) or {}).get('token', ''), 'resolve', note,\n                   {'resolution': resolution}, committed)",
     'console_tests/test_console_http.py::test_decide_fifty_at_once_with_one_changed_meanwhile'),
    ('console-all-selected-again', 'a "select all" run takes the filter\'s matches again when the person confirms: records '
     'that started to match after the count and sample were shown are decided, unseen',
     'idempo/console/app.py', "            run.resolution, run.note = resolution, note\n",
     "            run.resolution, run.note = resolution, note\n"
     "            run.items = db.select_all(conn, run.kind, run.filters)[0]\n",
     'console_tests/test_console_http.py::test_select_all_a_filter_matches_decides_only_what_was_selected '
     'console_tests/test_console_http.py::test_close_many_conflicts_at_once'),
    ('console-all-changed-decided', 'a "select all" run decides each record in the state it is in when its chunk '
     'runs, not the one it was selected in: a record changed meanwhile is decided',
     'idempo/console/app.py', "                    chunk = run.items[run.position:run.position + db.CHUNK]\n",
     "                    chunk = [(sc, k, (db.record(conn, sc, k, history=False) or {}).get('token', ''), c)\n"
     "                             for sc, k, _, c in run.items[run.position:run.position + db.CHUNK]]\n",
     'console_tests/test_console_http.py::test_select_all_a_filter_matches_decides_only_what_was_selected '
     'console_tests/test_console_http.py::test_close_many_conflicts_at_once'),
    ('console-bulk-conflict-forced', 'closing ticked conflicts at once closes one that occurred again after it was ticked',
     'idempo/console/app.py', "            for sc, k, token, cid in picks:     # a record's conflicts are closed together\n"
     "                items.setdefault((sc, k, token), []).append(cid)\n",
     "            for sc, k, token, cid in picks:     # a record's conflicts are closed together\n"
     "                items.setdefault((sc, k, db.record(conn, sc, k, history=False)['token']), []).append(cid)\n",
     'console_tests/test_console_http.py::test_close_many_conflicts_at_once'),
    ('console-all-hash-keys-selected', 'a "select all" run selects records of hash_keys scopes, which resolve() takes only '
     'with the key typed in clear: each is refused after the person confirmed a count that included it',
     'idempo/console/db.py', "                rows = [r for r in rows if not r['hash_keys']]\n", "",
     'console_tests/test_console_http.py::test_select_all_on_the_review_queue_leaves_hash_keys_scopes_out'),
    ('console-all-unbounded', 'a "select all" run takes every record the filter matches, however many: the session '
     'holds them all and the run never ends for the person',
     'idempo/console/db.py', "            rows = rows[:MAX_ALL]\n", "",
     'console_tests/test_console_http.py::test_select_all_stops_at_ten_thousand'),
    ('console-read-only-decides', '--read-only hides the forms but a decision sent anyway is taken',
     'idempo/console/app.py', "        if settings.read_only:\n            return page(request, 'error.html', 403, s, message='This console is read-only.')\n        note",
     "        if False:\n            return page(request, 'error.html', 403, s, message='This console is read-only.')\n        note",
     'console_tests/test_console_http.py::test_read_only_offers_and_takes_no_decision'),
    ('console-csrf-unchecked', "a decision is taken without the session's CSRF token: another site's form decides "
     'as the signed-in reviewer',
     'idempo/console/app.py', "                        not hmac.compare_digest(form.get('csrf', '').encode(), s.csrf.encode()):",
     "                        False:", 'console_tests/test_console_http.py::test_every_change_needs_the_sessions_csrf_token'),
    ('console-no-autoescape', 'values are written into pages unescaped: a key <script> runs in the reviewer\'s browser',
     'idempo/console/app.py', "autoescape=True,", "autoescape=False,",
     'console_tests/test_console_http.py::test_a_script_key_is_shown_as_text'),
    ('console-session-never-expires', 'a session opens pages however long it has been idle',
     'idempo/console/app.py', "if now - s.seen > self.settings.idle_seconds or", "if False and now - s.seen > self.settings.idle_seconds or",
     'console_tests/test_console_http.py::test_sessions_expire'),
    ('console-unchecked-sign-in', 'a role that pg_hba lets in without a password (trust, peer) signs in with any password',
     'idempo/console/db.py', "        if not conn.pgconn.used_password:", "        if False:",
     'console_tests/test_console_http.py::test_a_sign_in_the_server_did_not_check_is_refused'),
    ('console-superuser-signs-in', 'a superuser signs in: every scope is visible and decidable',
     'idempo/console/db.py', "        if row['rolsuper']:", "        if False:",
     'console_tests/test_console_http.py::test_a_superuser_is_refused'),
    ('console-reviewer-as-typed', 'the reviewer recorded is the name typed at sign-in, not the role the server signed in '
     '(a login name is cut to 63 bytes)',
     'idempo/console/app.py', "            role = await run_in_threadpool(db.sign_in, settings.dsn, role, password)",
     "            await run_in_threadpool(db.sign_in, settings.dsn, role, password)",
     'console_tests/test_console_http.py::test_the_reviewer_is_the_servers_name_for_the_session'),
    ('console-body-length-unchecked', 'a body announced longer than the limit is read before it is refused',
     'idempo/console/app.py', "        if not (length.isascii() and length.isdigit()) or int(length) > MAX_FORM:",
     "        if False:", 'console_tests/test_console_http.py::test_a_body_over_the_limit_is_refused_before_it_is_read'),
    ('console-body-read-whole', 'a body without a length (chunked) is read whole before its size is checked: memory '
     'for any size, before sign-in',
     'idempo/console/app.py', "        async for chunk in request.stream():\n            body += chunk\n"
     "            if len(body) > MAX_FORM:\n                raise TooLarge\n",
     "        body += await request.body()\n        if len(body) > MAX_FORM:\n            raise TooLarge\n",
     'console_tests/test_console_http.py::test_a_chunked_body_is_cut_at_the_limit'),
    ('console-log-decoded-path', "the log prints the decoded path: a %0A in a request writes a line of the sender's choosing",
     'idempo/console/app.py', "urllib.parse.quote(scope['path'], safe=LOG_SAFE)", "scope['path']",
     'console_tests/test_console_http.py::test_a_newline_in_the_path_does_not_forge_a_log_line'),
    ('console-csrf-as-str', 'the CSRF token is compared as str: a field that is not ASCII is a 500',
     'idempo/console/app.py', "hmac.compare_digest(form.get('csrf', '').encode(), s.csrf.encode())",
     "hmac.compare_digest(form.get('csrf', ''), s.csrf)",
     'console_tests/test_console_http.py::test_bad_input_is_answered_400_and_not_logged'),
    ('console-unicode-digits', "an age of '²' passes str.isdigit() and fails int(): a 500",
     'idempo/console/app.py', "        if age and not (age.isascii() and age.isdigit()):", "        if age and not age.isdigit():",
     'console_tests/test_console_http.py::test_bad_input_is_answered_400_and_not_logged'),
    ('console-data-error-narrow', 'only SQLSTATE 22000 is taken for bad input: a value out of range or a NUL is a 500',
     'idempo/console/app.py', "            except psycopg.DataError as e:", "            except psycopg.errors.DataException as e:",
     'console_tests/test_console_http.py::test_bad_input_is_answered_400_and_not_logged'),
    ('console-login-csrf-unchecked', "a sign-in is taken without the sign-in page's token: another site's form signs the "
     "victim's browser in as the attacker's role",
     'idempo/console/app.py', "        if cross_site(request) or not token or \\\n"
     "                not hmac.compare_digest(form.get('login_csrf', '').encode(), token.encode()):",
     "        if cross_site(request):",
     'console_tests/test_console_http.py::test_a_sign_in_from_another_site_is_refused'),
    ('console-login-origin-unchecked', 'a sign-in the browser says comes from another site (Origin, Sec-Fetch-Site) is taken',
     'idempo/console/app.py', "        if cross_site(request) or not token or", "        if not token or",
     'console_tests/test_console_http.py::test_a_sign_in_from_another_site_is_refused'),
    ('console-origin-null-refused', "a POST with Origin: null (what a browser sends under the console's "
     'Referrer-Policy: no-referrer) is taken for another site: nobody signs in from a browser',
     'idempo/console/app.py', "origin not in (None, 'null')", "origin is not None",
     'console_tests/test_console_http.py::test_a_sign_in_from_another_site_is_refused'),
    ('console-done-from-url', 'the "done" box shows a sentence from the URL: a link makes the console say anything',
     'idempo/console/app.py', "done=take_flash(s, ('record', scope, key))",
     "done=request.query_params.get('done') or take_flash(s, ('record', scope, key))",
     'console_tests/test_console_http.py::test_the_done_box_shows_only_what_the_console_said'),
    ('console-committed-unchecked', "a change committed to a row idempo's function does not lock (the record, for "
     'resolve_conflict) between the snapshot and the call is decided on',
     'idempo/console/db.py', "            if committed is not None:\n", "            if False:\n",
     'console_tests/test_console_http.py::test_a_change_to_a_row_the_decision_does_not_lock_is_refused'),
    ('console-sso-any-peer', "the single sign-on header is taken from any peer: whoever reaches the console "
     "directly names the reviewer they want to be",
     'idempo/console/app.py', "        if not peer_trusted(peer, settings.sso_trust):", "        if False:",
     'console_tests/test_console_http.py::test_sso_header_from_another_peer_is_ignored'),
    ('console-sso-group-unchecked', "single sign-on serves any role the console's own role may become, not only "
     "the reviewers' group",
     'idempo/console/db.py', "        if not row['in_group']:", "        if False:",
     'console_tests/test_console_http.py::test_sso_refuses_a_role_outside_the_group_a_superuser_and_no_role'),
    ('console-sso-superuser', 'single sign-on serves a superuser role the console was granted',
     'idempo/console/db.py', "        if row['rolsuper'] or row['rolcreaterole'] or row['rolbypassrls']:\n"
     "            raise NotChecked('a superuser, or", "        if False:\n            raise NotChecked('a superuser, or",
     'console_tests/test_console_http.py::test_sso_refuses_a_role_outside_the_group_a_superuser_and_no_role'),
    ('console-sso-session-unbound', "a single sign-on session outlives its header: the proxy names bob, the "
     "browser still acts as alice",
     'idempo/console/app.py', "                if s is not None and s.sso != who:", "                if s is not None and who is None:",
     'console_tests/test_console_http.py::test_sso_a_changed_header_ends_the_session'),
    ('console-sign-in-unlimited', 'failed sign-ins are not limited: a role\'s password is guessed at the speed of '
     'the server',
     'idempo/console/app.py', "        if wait:", "        if False:",
     'console_tests/test_console_http.py::test_failed_sign_ins_are_limited_per_address_and_per_role'),
    ('console-sign-in-name-uncut', 'failed sign-ins are counted by the name as typed: a suffix past the 63 bytes '
     'PostgreSQL keeps makes every guess a new name',
     'idempo/console/app.py', "role.encode('utf-8', 'replace')[:63]", "role.encode('utf-8', 'replace')",
     'console_tests/test_console_http.py::test_the_role_name_is_limited_as_the_server_cuts_it'),
    # (id, intent, file, find, replace, pytest -k / files)
    ('http-retry-takes-lease', 'an HTTP retry of an unknown key takes the verification lease: the verifier is told busy',
     'idempo/http.py', "now=True,\n                                        verify_unknown=verify))",
     "now=True))",
     'tests/test_http.py::test_retries_of_an_unknown_key_leave_the_verification_lease_to_the_verifier'),
    ('http-calls-out-no-heartbeat', "a calls_out handler's lease is not held while it calls out: a retry whose lookup "
     'finds nothing yet runs attempt 2, a second call',
     'idempo/http.py', "    beat = F.heartbeat_for(claim)\n", "    beat = None\n",
     'tests/test_http.py -k holds_its_lease'),
    ('http-lookup-lease-long', "a request takes the verification lease for its lookup with the attempt's lease: a "
     'lookup that fails locks the retries and the verifier out for that long',
     'idempo/http.py', "lease=route.lookup_lease if verify else route.lease,", "lease=route.lease,",
     'tests/test_http.py -k lookup_that_fails'),
    ('http-lookup-not-called', 'a route with a lookup answers an unknown key 409 without looking it up',
     'idempo/http.py', "    if verified and claim.outcome is Outcome.UNKNOWN:", "    if False:",
     'tests/test_http.py::test_a_route_lookup_settles_an_unknown_key_on_the_retry'),
    ('busy-enters-block', 'once() lets a busy claim into the block: two callers run it',
     'idempo/_sync.py', "        if claim.outcome not in (Outcome.ACQUIRED, Outcome.REPLAY):",
     "        if claim.outcome not in (Outcome.ACQUIRED, Outcome.REPLAY, Outcome.BUSY):",
     'tests/test_core.py::test_once_busy_raises_or_waits'),
    ('wait-holds-row-lock', 'a waiting claim keeps the row lock of its busy answer: the holder cannot finish',
     'idempo/_flow.py', "        yield Sql('ROLLBACK TO SAVEPOINT idempo_wait', None, fetch=False)\n", "",
     'tests/test_core.py::test_once_busy_raises_or_waits'),
    ('exit-without-complete', 'the block ends without complete(): the record stays in_progress, nothing to replay',
     'idempo/_sync.py', "    def __exit__(self, exc_type, exc, tb):\n        if exc_type is None and self.acquired and not self._finished:",
     "    def __exit__(self, exc_type, exc, tb):\n        if False:", 'tests/test_core.py::test_once_runs_once_and_replays'),
    ('claim-no-params', 'a claim goes without its parameters: a changed request replays',
     'idempo/_flow.py', "        params_args = (to_json(params),)", "        params_args = (None,)",
     'tests/test_core.py::test_decorator'),
    ('conflict-without-fields', 'a conflict does not say which fields changed',
     'idempo/_flow.py', "        if row is not None and row[0] is not None:", "        if False:",
     'tests/test_core.py::test_once_conflict_carries_id_and_changed_fields'),
    ('version-any', 'any version of the SQL objects is accepted',
     'idempo/_flow.py', "    return version is not None and any(", "    return True or any(",
     'tests/test_core.py::test_version_refused_with_a_clear_message tests/test_flows.py::test_version_flow'),
    ('sqlstate-untyped', 'a 55000 arrives as the generic DatabaseRefusal',
     'idempo/_types.py', "_BY_SQLSTATE = {cls.sqlstate: cls for cls in DatabaseRefusal.__subclasses__()}",
     "_BY_SQLSTATE = {cls.sqlstate: cls for cls in DatabaseRefusal.__subclasses__() if cls is not InvalidState}",
     'tests/test_flows.py::test_sqlstates_map_to_types tests/test_core.py::test_sqlstates_become_exceptions'),
    ('doubt-is-retryable', 'an unclear call (a lost reply) frees the key: the next attempt charges again',
     'idempo/_flow.py', "    return True if honours_key else None", "    return True",
     'tests/test_flows.py::test_in_doubt_writes_nothing tests/test_lost_replies.py'),
    ('unknown-runs-again', 'unknown is taken as acquired: the call runs again without a lookup',
     'idempo/_flow.py', "        if claim.outcome is Outcome.UNKNOWN:\n            if lookup is None:",
     "        if claim.outcome is Outcome.UNKNOWN:\n            claim = Claim(**{**claim.__dict__, 'outcome': Outcome.ACQUIRED})\n        if False:\n            if lookup is None:",
     'tests/test_call.py::test_lost_reply_is_in_doubt_then_found_by_lookup'),
    ('verify-race-raises', 'a refused verify (another verifier won) is raised instead of claiming again',
     'idempo/_flow.py', "            except Superseded:\n                continue", "            except Superseded:\n                raise",
     'tests/test_flows.py::test_verify_race_claims_again'),
    ('no-heartbeat', 'the lease is not extended while the call runs: another worker takes the key over',
     'idempo/_sync.py', "            self.beat.start()\n", "",
     'tests/test_call.py::test_heartbeat_keeps_the_lease'),
    ('decline-not-recorded', 'a final failure is not recorded: the replay does not know it',
     'idempo/_flow.py', "        if decision is False:        # a final failure", "        if decision is None:        # a final failure",
     'tests/test_call.py::test_retryable_rule_and_final_failure tests/test_flows.py::test_call_error_rule'),
    ('replay-unmarked', 'a replayed reply lacks Idempotent-Replayed: true',
     'idempo/http.py', "        return cls(stored['status'], headers + [(REPLAYED, 'true')], body)",
     "        return cls(stored['status'], headers, body)",
     'tests/test_http.py::test_first_request_then_replay_of_status_headers_body'),
    ('store-5xx', 'a 5xx reply is stored (and the writes before it commit): the retry replays the failure',
     'idempo/http.py', "    return status < 500 and status not in NOT_STORED_4XX", "    return status not in NOT_STORED_4XX",
     'tests/test_http.py::test_a_5xx_reply_is_not_stored_and_its_writes_roll_back'),
    ('tenant-ignored', 'keys are not per client: one client replays another\'s reply',
     'idempo/http.py', "        key = f'{key_part(tenant)}/{key}'", "        key = key",
     'tests/test_http.py::test_keys_are_per_client'),
    ('path-without-query', 'the fingerprint leaves out the query string',
     'idempo/asgi.py', "        path = path.decode('latin-1') + ('?' + query.decode('latin-1') if query else '')",
     "        path = path.decode('latin-1')", 'tests/test_http.py::test_conflict_422 -k asgi'),
    ('busy-not-409', 'a request while the first runs gets 422 instead of 409 + Retry-After',
     'idempo/http.py', "        return problem(409, 'key-in-use',", "        return problem(422, 'key-in-use',",
     'tests/test_http.py::test_busy_409_while_the_first_is_in_its_transaction'),
    ('calls-out-no-release', 'a failed provider call leaves the attempt in_progress: the retry waits for the lease',
     'idempo/http.py', "    elif route.on_error != 'retry':\n        return", "    elif True:\n        return",
     'tests/test_http.py::test_provider_fails_502_then_attempt_2'),
    ('calls-out-retries-by-default', "Route(calls_out=True) fails the attempt retryable unless told otherwise: against a "
     'provider that does not deduplicate, the retry after a lost reply charges again',
     'idempo/http.py', "    on_error: str = 'doubt'\n", "    on_error: str = 'retry'\n",
     'tests/test_http.py::test_calls_out_by_default_leaves_a_lost_reply_to_its_lease'),
    ('on-error-typo-accepted', "Route(on_error='retyr') is accepted and acts as 'doubt' or 'retry' without saying which",
     'idempo/http.py', "        if self.on_error not in ('doubt', 'retry'):\n", "        if False:\n",
     'tests/test_http.py::test_an_unknown_on_error_is_refused'),
    # the review of session 10
    ('heartbeat-extends-by-scope', "call_once heartbeats with extend => NULL (the scope's lease, never shortening): "
     'a claim with a longer lease(=>) is never extended and loses the key when it runs out',
     'idempo/_flow.py', "        extend = claim.lease_expires_at - claim.now\n", "        extend = None\n",
     'tests/test_call.py::test_heartbeat_extends_by_the_lease_claimed_with'),
    ('heartbeat-left-running', 'a cancelled or interrupted call leaves its heartbeat running: the key is held forever',
     'idempo/_flow.py', "    except BaseException as err:\n        # every exit stops the heartbeat",
     "    except Exception as err:\n        # every exit stops the heartbeat",
     'tests/test_call.py::test_heartbeat_stops_when_the_call_is_interrupted '
     'tests/test_call.py::test_async_heartbeat_stops_when_the_task_is_cancelled'),
    ('aio-plain-call-in-loop', "aio.call_once runs a plain (blocking) call in the event loop: the heartbeat stops "
     'and another worker takes the key over',
     'idempo/aio.py', "            if op.outside and not inspect.iscoroutinefunction(op.fn):",
     "            if False:", 'tests/test_call.py::test_async_plain_call_does_not_block_the_heartbeat'),
    ('tenant-key-shifted', 'tenant "acme" with key "eu/x" is tenant "acme/eu" with key "x": one client replays another\'s reply',
     'idempo/http.py', "    return value.replace('%', '%25').replace('/', '%2F') if '/' in value or '%' in value else value",
     "    return value", 'tests/test_http.py::test_tenant_and_key_cannot_be_shifted_into_each_other'),
    ('record-cancel-leaves-transaction', 'a cancelled record() leaves the connection in the open transaction of its write',
     'idempo/_flow.py', "    except BaseException as err:\n        yield Rollback()\n        if not isinstance(err, Exception):",
     "    except Exception as err:\n        yield Rollback()\n        if not isinstance(err, Exception):",
     'tests/test_call.py::test_async_cancelled_in_record_leaves_no_transaction_open'),
    ('wsgi-chunked-body-dropped', 'a chunked request body (no Content-Length) is read as empty: the app sees none, the fingerprint ignores it',
     'idempo/wsgi.py', "        if not environ.get('CONTENT_LENGTH') and environ.get('wsgi.input_terminated'):",
     "        if False:", 'tests/test_http.py::test_wsgi_chunked_body_is_read_and_fingerprinted'),
    ('runner-race', 'two threads starting on one connection make two Runners (two locks): the heartbeat interleaves',
     'idempo/_sync.py', "                runner = _runners.setdefault(conn, runner)", "                _runners[conn] = runner",
     'tests/test_core.py::test_one_runner_per_connection_across_threads'),
    ('set-cookie-stored', 'Set-Cookie (a per-client header) is stored: a replay hands one client\'s session to whoever sends the key',
     'idempo/http.py', "if n not in HOP_BY_HOP and (n not in PER_CLIENT or n in keep)]}", "if n not in HOP_BY_HOP]}",
     'tests/test_http.py::test_per_client_headers_are_not_stored_unless_kept'),
    ('field-key-shifted', 'key field values are joined unescaped: fields "x/y","z" and "x","y/z" are one key (Node derives it otherwise)',
     'idempo/http.py', "        parts.append(key_part(json.dumps(value) if not isinstance(value, str) else value))",
     "        parts.append(json.dumps(value) if not isinstance(value, str) else value)",
     'tests/test_http.py::test_key_derivation_matches_the_shared_vectors'),
    ('unsettled-says-no-time', 'an empty lookup inside the settle window raises Unknown without saying when the window ends',
     'idempo/_flow.py', "                settle = yield from settle_window_flow(claim)\n", "                pass\n",
     'tests/test_call.py::test_not_found_inside_the_settle_window_says_until_when'),
    ('key-not-text-passes', 'an int or UUID key goes to the server, which answers "function idempo.claim(unknown, integer) does not exist"',
     'idempo/_flow.py', "        if not isinstance(value, str):\n", "        if False:\n",
     'tests/test_core.py::test_a_key_that_is_not_text_is_refused_by_name'),
    ('reset-taken-as-not-sent', "the example's rule takes a reset connection (a lost reply: charged) for a request never sent",
     'examples/payment_job.py', 'True if isinstance(err, ConnectionRefusedError) else None',
     'True if isinstance(err, ConnectionError) else None',
     'tests/test_payment_job.py::test_the_payment_job[payment_job]'),
    ('first-answer-unstored', "once's first answer is the object set, its replay the jsonb read back: a tuple turns into a list on a retry",
     'idempo/_sync.py', "            self.result = F.stored(result, text)", "            pass",
     'tests/test_core.py::test_a_result_reads_the_same_the_first_time_and_replayed'),
    ('first-answer-fast-key-order', "once's first answer, copied without parsing it back, keeps the keys in the order "
     "set, its replay in jsonb's order",
     'idempo/_flow.py', "        keys = sorted(value, key=_jsonb_key) if len(value) > 1 else value", "        keys = value",
     'tests/test_flows.py::test_the_first_answer_is_what_jsonb_gives_back_without_parsing_it_again '
     'tests/test_core.py::test_a_number_reads_the_same_the_first_time_and_replayed'),
    ('first-answer-fast-exponent-float', "once's first answer, copied without parsing it back, keeps 1e+16 a float, "
     "its replay the int jsonb writes",
     'idempo/_flow.py', "        return _numeric(float.__repr__(value))", "        return value",
     'tests/test_flows.py::test_the_first_answer_is_what_jsonb_gives_back_without_parsing_it_again '
     'tests/test_core.py::test_a_number_reads_the_same_the_first_time_and_replayed'),
    ('first-answer-fast-tuple', "once's first answer, copied without parsing it back, keeps a tuple, its replay a list",
     'idempo/_flow.py', "        return [_plain(v) for v in value]", "        return value if t is tuple else [_plain(v) for v in value]",
     'tests/test_flows.py::test_the_first_answer_is_what_jsonb_gives_back_without_parsing_it_again'),
    ('once-enters-on-busy', "once() without the flow's generators enters the block on a busy answer (the work runs "
     "while another holds the key) instead of raising Busy",
     'idempo/_sync.py', "        if answer.outcome is not Outcome.REPLAY and answer.outcome is not Outcome.ACQUIRED:",
     "        if answer.outcome is Outcome.CONFLICT:",
     'tests/test_core.py::test_once_busy_raises_or_waits'),
    ('value-any-bytes-as-ascii', "a claim's answer read straight from libpq is decoded as ASCII whatever it holds: "
     "a replay of a result with an accent fails",
     'idempo/_sync.py', "                        if v is not None and v.isascii():", "                        if v is not None:",
     'tests/test_core.py::test_a_number_reads_the_same_the_first_time_and_replayed'),
    ('call-first-answer-unstored', "call_once's first Done carries record's object, its replay the jsonb read back",
     'idempo/_flow.py', "    return Done(scope, key, status, attempt, as_stored(text), ref)",
     "    return Done(scope, key, status, attempt, result, ref)",
     'tests/test_call.py::test_the_result_reads_the_same_the_first_time_and_replayed'),
    ('first-answer-exponent-float', "the first answer reads 1e+16 as the float json.loads makes of it, its replay as the int jsonb writes",
     'idempo/_flow.py', "json.loads(text, parse_float=_numeric, object_pairs_hook=_jsonb_object)",
     "json.loads(text, object_pairs_hook=_jsonb_object)",
     'tests/test_core.py::test_a_number_reads_the_same_the_first_time_and_replayed'),
    ('first-answer-key-order', "the first answer keeps the keys in the order set, its replay in jsonb's order",
     'idempo/_flow.py', "json.loads(text, parse_float=_numeric, object_pairs_hook=_jsonb_object)",
     "json.loads(text, parse_float=_numeric)",
     'tests/test_core.py::test_a_number_reads_the_same_the_first_time_and_replayed'),
    ('template-unmatched', "routes={'/orders/{order_id}/refund': ...} is compared as an exact path: the endpoint is silently unprotected",
     'idempo/http.py', "        return next((r for pattern, r in self.templates\n",
     "        return None and next((r for pattern, r in self.templates\n",
     'tests/test_http.py::test_a_route_with_path_parameters_is_protected'),
    ('route-method-stops-the-match', "an exact path (or the first template) without the request's method ends the match: the template the framework runs is unprotected",
     'idempo/http.py', "        if route is not None and method in self.route_methods[id(route)]:\n            return route\n",
     "        if route is not None:\n            return route if method in self.route_methods[id(route)] else None\n",
     'tests/test_http.py::test_routes_match_as_the_framework_routes'),
    ('route-template-first-path', 'the first template whose path matches is taken, its methods checked after: a later one with the method is not tried',
     'idempo/http.py', "                     if method in self.route_methods[id(r)] and pattern.fullmatch(path)), None)",
     "                     if pattern.fullmatch(path)), None)",
     'tests/test_http.py::test_routes_match_as_the_framework_routes'),
    ('route-without-slash-accepted', "a route written as Django's path() writes it ('orders/<int:id>') is accepted and matches nothing",
     'idempo/http.py', "            if not isinstance(path, str) or not path.startswith('/'):",
     "            if not isinstance(path, str):",
     'tests/test_http.py::test_routes_match_as_the_framework_routes'),
    ('route-methods-as-letters', "Route(methods='POST') is taken as the letters P, O, S, T: the endpoint is unprotected",
     'idempo/http.py', "((route.methods,) if isinstance(route.methods, str)", "((route.methods,) if False",
     'tests/test_http.py::test_routes_match_as_the_framework_routes'),
    ('asgi-route-with-root-path', "the ASGI middleware matches scope['path'] with its root path (uvicorn >= 0.26 --root-path): no route matches, the endpoint is unprotected",
     'idempo/asgi.py', "self.routes.match(scope['method'], route_path(scope))", "self.routes.match(scope['method'], scope['path'])",
     'tests/test_http.py::test_asgi_routes_on_the_path_without_its_root_path'),
    ('route-converter-any-segment', "'<int:id>' takes any segment: the framework's other endpoint for '/orders/abc' is made to require a key",
     'idempo/http.py', "else _CONVERTERS.get(converter, '[^/]+')))", "else '[^/]+'))",
     'tests/test_http.py::test_routes_match_as_the_framework_routes'),
    ('caller-refusal-stored', 'a 401 or 403 is stored: the caller, its credentials mended, gets it back under its key',
     'idempo/http.py', "NOT_STORED_4XX = frozenset({400, 401, 403, 408, 409, 415, 422, 425, 429})",
     "NOT_STORED_4XX = frozenset({400, 408, 409, 415, 422, 425, 429})",
     'tests/test_http.py::test_a_401_or_403_is_not_stored'),
    ('unstarted-left-in-doubt', "a calls_out request refused before its view (Django's CSRF 403, Flask's before_request 401) "
     'is left to the lease under on_error=doubt: the caller, its credentials mended, gets 409 and then a key in review',
     'idempo/http.py', "    if started is False:", "    if False:",
     'tests/test_http.py::test_refused_before_the_view_started_frees_the_key'),
    ('django-view-start-unmarked', "Django's process_view does not mark the view started: a view that answered 403 or "
     'raised (it may have called the other system) frees its key, and the retry calls again',
     'idempo/django.py', "        if isinstance(ctx, Context):\n            ctx.started = True",
     "        if isinstance(ctx, Context):\n            pass",
     'tests/test_http.py::test_refused_by_the_view_that_started_is_left_in_doubt[django]'),
    ('flask-view-start-unmarked', "Flask's dispatch_request wrapper does not mark the view started: a view that answered "
     '403 or raised frees its key, and the retry calls again',
     'idempo/flask.py', "                ctx.started = True", "                pass",
     'tests/test_http.py::test_refused_by_the_view_that_started_is_left_in_doubt[flask]'),
    ('flask-start-unknown', "idempo.flask leaves Context.started at None (cannot tell): a before_request "
     '401 is left to the lease',
     'idempo/flask.py', "            if ctx is not None and ctx.started is None:\n                ctx.started = False\n", "",
     'tests/test_http.py::test_refused_before_the_view_started_frees_the_key[flask]'),
    # from a trial by outside users
    ('json-depth-unchecked', 'a deeply nested JSON body reaches json.loads: RecursionError, a 500 (and deeper than '
     "the Node middleware's limit accepted)",
     'idempo/http.py', "        if json_too_deep(body):\n", "        if False:\n",
     'tests/test_http.py::test_deeply_nested_json_is_refused_400_and_uses_no_key'),
    ('json-depth-counts-strings', 'brackets inside JSON strings count toward the depth: a body with "[[[" in a string value is refused',
     'idempo/http.py', "    for m in _BRACKET.finditer(_JSON_STRING.sub(b'', body)):", "    for m in _BRACKET.finditer(body):",
     'tests/test_http.py::test_json_depth_counts_arrays_and_objects_not_brackets_in_strings'),
    ('key-space-accepted', "a key with a space ('a b', '\"a b\"') is accepted: the docs say visible ASCII, and Node refuses it",
     'idempo/http.py', "VISIBLE_ASCII = re.compile(r'[\\x21-\\x7e]+')", "VISIBLE_ASCII = re.compile(r'[\\x20-\\x7e]+')",
     'tests/test_http.py::test_key_derivation_matches_the_shared_vectors'),
    ('key-comma-list-accepted', "'Idempotency-Key: a, b' (two values, two headers joined) is taken as the key 'a, b'",
     'idempo/http.py', "    items = [item for value in values for item in _split_list(value)]", "    items = list(values)",
     'tests/test_http.py::test_key_derivation_matches_the_shared_vectors'),
    ('asgi-stale-500', 'a pooled connection left stale by a restart is a 500 under ASGI (the exception goes to the framework)',
     'idempo/asgi.py', "                        if not connection_lost(err, conn):\n                            raise",
     "                        if True:\n                            raise", 'tests/test_restart.py -k asgi'),
    ('asgi-stale-no-retry', 'a stale pooled connection is answered 503 without trying another: after a restart, a 503 for '
     'every stale connection of the pool',
     'idempo/asgi.py', "        for tries_left in (1, 0):", "        for tries_left in (0,):", 'tests/test_restart.py -k asgi'),
    ('wsgi-stale-500', 'a pooled connection left stale by a restart is a 500 under WSGI (Flask)',
     'idempo/wsgi.py', "                        if not connection_lost(err, runner.raw):\n                            raise",
     "                        if True:\n                            raise", 'tests/test_restart.py -k flask'),
    ('wsgi-view-lost-500', "Flask's 500 for a view whose connection the server ended is sent as it is (nothing was "
     'committed: 503, retry)',
     'idempo/wsgi.py', "                        if reply.status >= 500 and connection_closed(runner.raw):",
     "                        if False:", 'tests/test_http.py::test_the_view_loses_its_connection_503_and_the_retry_runs'),
    ('django-view-lost-500', "Django's 500 for a view whose connection the server ended is sent as it is",
     'idempo/django.py', "                if reply.status >= 500 and connection_closed(runner.raw):",
     "                if False:", 'tests/test_http.py::test_the_view_loses_its_connection_503_and_the_retry_runs'),
    ('settled-replayed-as-reply', 'a key a person settled with no stored reply (resolve, verify with a target_ref) is '
     'replayed as a reply: Reply.from_stored raises, a 500 on every retry',
     'idempo/http.py', "        if Reply.is_stored(claim.result):\n", "        if True:\n",
     'tests/test_http.py::test_settled_by_a_person_without_a_reply_409_with_what_is_known'),
    ('runner-holds-connection', 'the Runner kept per connection holds it strongly: every connection the library '
     'used stays alive after the application dropped it',
     'idempo/_sync.py', "self._conn = self._raw = weakref.ref(conn)", "self._conn = self._raw = (lambda: conn)",
     "tests/test_core.py -k freed"),
    ('version-prefix-accepted', "a database version that only starts like a supported one ('1.0.0-beta', "
     "'1.0.0.1') is accepted, where the Node library refuses it",
     'idempo/_flow.py', "SUPPORTED.fullmatch(version) is not None", "SUPPORTED.match(version) is not None",
     "tests/test_flows.py -k exactly"),
    # the shared HTTP contract (clients/http-vectors.json, docs/http-contract.md)
    ('busy-retry-after-fixed', "a busy 409's Retry-After is always 1, not the seconds left on the lease (the Node "
     'middleware gives the lease)',
     'idempo/http.py', "    if claim.lease_expires_at is None:\n        return route.retry_after",
     "    if True:\n        return route.retry_after", "tests/test_http_vectors.py -k lease"),
    ('fingerprint-null-members', 'a request without a body is fingerprinted with a "json": null member that the Node '
     'middleware leaves out: the retry sent to a Node service is answered 422',
     'idempo/http.py', "PARAMS_SQL = \"jsonb_build_object('method', %s::text, 'path', %s::text)\"",
     "PARAMS_SQL = \"jsonb_build_object('method', %s::text, 'path', %s::text, 'json', NULL::jsonb)\"",
     "tests/test_http_vectors.py -k no_body"),
    ('problem-type-blank', "the problems' type is about:blank#..., not the contract's type (the Node middleware's)",
     'idempo/http.py', "PROBLEM_TYPE_BASE = 'https://idempo.dev/problems'", "PROBLEM_TYPE_BASE = 'about:blank'",
     "tests/test_http_vectors.py -k no_key"),
    ('no-editable', 'the build backend has no PEP 660 hook: pip install -e ./clients/python is refused',
     'build_backend.py', "def build_editable(", "def _build_editable(",
     'tests/test_install.py::test_an_editable_install_runs_the_clone'),
]


def main(selected):
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    passed = failed = 0
    for mid, intent, path, find, replace, tests in MUTANTS:
        if selected and mid not in selected:
            continue
        with tempfile.TemporaryDirectory(prefix=f'idempo-py-mutant-{mid}-') as work:
            # the tree's layout: the tests find schema.sql, docs/python.md and idempo.control
            # at ../../.. from their directory
            copy = os.path.join(work, 'clients', 'python')
            shutil.copytree(here, copy, ignore=shutil.ignore_patterns('__pycache__'))
            shutil.copy(os.path.join(here, '..', '..', 'idempo.control'), work)
            shutil.copy(os.path.join(here, '..', 'key-vectors.json'), os.path.join(work, 'clients'))
            shutil.copy(os.path.join(here, '..', 'http-vectors.json'), os.path.join(work, 'clients'))
            # the schema and docs the tests read, where they look for them
            os.makedirs(os.path.join(work, 'test', 'examples', 'http'))
            shutil.copy(os.path.join(here, '..', '..', 'test', 'examples', 'http', 'schema.sql'),
                        os.path.join(work, 'test', 'examples', 'http'))
            os.makedirs(os.path.join(work, 'docs'))
            shutil.copy(os.path.join(here, '..', '..', 'docs', 'python.md'), os.path.join(work, 'docs'))
            target = os.path.join(copy, path)
            text = open(target).read()
            if text.count(find) != 1:
                print(f'STALE   {mid}: the pattern matches {text.count(find)} times in {path}')
                failed += 1
                continue
            open(target, 'w').write(text.replace(find, replace))
            args = []
            for t in tests.split():
                args.append(t if t.startswith('-') or args[-1:] == ['-k'] else os.path.join(copy, t))
            env = {**os.environ, 'PYTHONPATH': copy, 'IDEMPO_TEST_DOCS': os.path.join(work, 'docs', 'python.md')}
            r = subprocess.run([sys.executable, '-m', 'pytest', '-x', '-q', '-p', 'no:cacheprovider', *args],
                               cwd=os.path.join(copy, 'tests'), env=env, capture_output=True, text=True, timeout=900)
            last = (r.stdout.strip().splitlines() or [''])[-1]
            if r.returncode == 0:
                print(f'SURVIVED {mid}: {intent}\n  {last}')
                failed += 1
            elif ' failed' not in last:
                # an error (a missing file, a fixture) is not a kill: the tests must fail on the slip
                print(f'ERROR   {mid}: the tests did not run to a failure\n  {last}')
                failed += 1
            else:
                print(f'killed  {mid}: {intent}')
                passed += 1
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(set(sys.argv[1:])))
