"""The flows without a database: each test scripts what the server answers and checks what the
flow asks for, in order (the statements it sends, the transactions, the calls)."""
import pytest

import idempo
from idempo import _flow as F
from idempo._types import from_database_error


class Refused(Exception):
    def __init__(self, sqlstate, message='refused'):
        super().__init__(message)
        self.sqlstate = sqlstate


def claim_row(outcome, status=None, attempt=1, result=None, conflict_id=None):
    return (outcome, status, attempt, result, None, None, None, None, conflict_id, None, None, None)


def drive(gen, answers):
    """Runs a flow: answers(op) -> value, or an exception instance to throw.  -> (result, log)."""
    log, send, throw = [], None, None
    while True:
        try:
            op = gen.throw(throw) if throw is not None else gen.send(send)
        except StopIteration as stop:
            return stop.value, log
        send, throw = None, None
        log.append(op)
        value = answers(op)
        if isinstance(value, BaseException):
            throw = F.translate(value) if isinstance(op, F.Sql) else value
        else:
            send = value


def kinds(log):
    out = []
    for op in log:
        if isinstance(op, F.Sql):
            out.append(op.sql.split('(')[0].replace('SELECT ', '').split(',')[0].strip()
                       if 'idempo.claim' not in op.sql else 'claim')
        else:
            out.append(type(op).__name__)
    return out


def test_one_round_trip_to_claim():
    """once()'s claim is one statement when on_busy is 'raise' (the fast path's cost)."""
    gen = F.claim_until_decided('s', 'k', {'a': 1}, on_busy='raise', busy_timeout=1)
    claim, log = drive(gen, lambda op: claim_row('acquired', 'in_progress'))
    assert claim.acquired and kinds(log) == ['claim']


def test_verify_race_claims_again():
    """unknown -> lookup found -> verify refused (another verifier won) -> rolled back, claimed
    again -> replay."""
    claims = iter([claim_row('unknown', 'unknown'), claim_row('replay', 'succeeded', result='{"charge": "c1"}')])
    recorded = []

    def answers(op):
        if isinstance(op, F.Sql) and 'idempo.claim' in op.sql:
            return next(claims)
        if isinstance(op, F.Sql) and 'idempo.verify' in op.sql:
            return Refused('55000', 'operation is succeeded, not unknown')
        if isinstance(op, F.Call):
            return {'id': 'c1'} if op.fn is lookup else recorded.append(op.args)
        return None

    def lookup(key):
        return {'id': 'c1'}

    def record(conn, found):
        return found

    done, log = drive(F.call_flow('CONN', 's', 'k', call=None, lookup=lookup, record=record), answers)
    assert done.replayed and done.result == {'charge': 'c1'}
    assert kinds(log) == ['Begin', 'claim', 'Commit', 'Call', 'Begin', 'Call', 'idempo.verify', 'Rollback',
                          'Begin', 'claim', 'Commit']


def test_call_error_rule():
    """The rule's three answers: True -> fail(retryable) and raise; False -> fail(final) and
    Done(failed); None -> nothing written, raise."""
    def run(rule):
        def answers(op):
            if isinstance(op, F.Sql) and 'idempo.claim' in op.sql:
                return claim_row('acquired', 'in_progress')
            if isinstance(op, F.Call):
                return ValueError('no')
            if isinstance(op, F.Sql):
                return ('retryable',)
            return None
        return drive(F.call_flow('C', 's', 'k', call=lambda key: None, retryable=lambda e: rule, heartbeat=0), answers)

    with pytest.raises(ValueError):
        run(True)
    done, log = run(False)
    assert done.failed and done.error == 'ValueError: no'
    assert [op.args[-1] for op in log if isinstance(op, F.Sql) and 'idempo.fail' in op.sql] == [False]
    with pytest.raises(ValueError):
        run(None)


def test_in_doubt_writes_nothing():
    sent = []

    def answers(op):
        if isinstance(op, F.Sql):
            sent.append(op.sql)
            return claim_row('acquired', 'in_progress') if 'idempo.claim' in op.sql else ('x',)
        if isinstance(op, F.Call):
            return TimeoutError('reply lost')
        return None
    with pytest.raises(TimeoutError):
        drive(F.call_flow('C', 's', 'k', call=lambda key: None, heartbeat=0), answers)
    assert len(sent) == 1 and 'idempo.claim' in sent[0]


def test_sqlstates_map_to_types():
    for code, cls in [('42704', idempo.NotFound), ('55000', idempo.InvalidState), ('42501', idempo.PermissionDenied),
                      ('22023', idempo.InvalidArgument), ('22004', idempo.InvalidArgument),
                      ('55P03', idempo.LockNotAvailable), ('40001', idempo.SerializationFailure),
                      ('25006', idempo.ReadOnly), ('ID001', idempo.ClaimNotReplicated),
                      ('42883', idempo.UndefinedFunction), ('XX000', idempo.DatabaseRefusal)]:
        err = from_database_error(Refused(code))
        assert type(err) is cls and err.sqlstate == code
    wrapped = RuntimeError('a wrapper (Django, SQLAlchemy) keeps the driver error as its cause')
    wrapped.__cause__ = Refused('42704')
    assert type(from_database_error(wrapped)) is idempo.NotFound
    assert from_database_error(ValueError('plain')) is None


def test_version_flow():
    def answers_for(has, ext, found):
        def answers(op):
            return (has, ext) if 'to_regprocedure' in op.sql else (found,)
        return answers
    assert drive(F.version_flow(), answers_for(True, '0.3.0', '0.3.0'))[0] == '0.3.0'
    assert drive(F.version_flow(), answers_for(True, '0.3.0', '0.3.7'))[0] == '0.3.7'
    # 1.x keeps 0.3.0's API (docs/upgrading.md): every 1.y is spoken, 2.0 and 10.0 are not
    assert drive(F.version_flow(), answers_for(True, '1.0.0', '1.0.0'))[0] == '1.0.0'
    assert drive(F.version_flow(), answers_for(True, '1.4.2', '1.4.2'))[0] == '1.4.2'
    with pytest.raises(idempo.UnsupportedVersion, match='the database has idempo 2.0.0'):
        drive(F.version_flow(), answers_for(True, '2.0.0', '2.0.0'))
    with pytest.raises(idempo.UnsupportedVersion, match='the database has idempo 10.0.0'):
        drive(F.version_flow(), answers_for(True, '10.0.0', '10.0.0'))
    with pytest.raises(idempo.UnsupportedVersion, match='the database has idempo 0.2.0'):
        drive(F.version_flow(), answers_for(False, '0.2.0', None))
    with pytest.raises(idempo.UnsupportedVersion, match='the database has idempo 0.4.0'):
        drive(F.version_flow(), answers_for(True, '0.4.0', '0.4.0'))
    with pytest.raises(idempo.UnsupportedVersion, match='the database has idempo 0.30.1'):
        drive(F.version_flow(), answers_for(True, '0.30.1', '0.30.1'))


# The same strings the Node library's test refuses (clients/node/test/core.test.js): one rule
VERSIONS_REFUSED = ['1', '1.0', '1.0.0-beta', '1.foo', '1.', '1..0', '0.3', '0.3.0-beta', '1.0.0.1',
                    '10.0.0', '0.30.0', '2.0.0', '0.2.0', '1.0.0\n', '\u0661.0.0', '']
VERSIONS_SPOKEN = ['0.3.0', '0.3.7', '1.0.0', '1.4.2', '1.10.12']


def test_supported_versions_are_exactly_0_3_x_and_1_x():
    assert [v for v in VERSIONS_SPOKEN if not F.supported(v)] == []
    assert [v for v in VERSIONS_REFUSED if F.supported(v)] == []


def test_versioned_with_the_extension():
    """The library's version is the extension's (idempo.control's default_version), in the
    package, its metadata and the SQL API version it asks for."""
    import os
    import re
    here = os.path.dirname(os.path.abspath(__file__))
    control = open(os.path.join(here, '..', '..', '..', 'idempo.control')).read()
    default = re.search(r"^default_version\s*=\s*'([^']+)'", control, re.M).group(1)
    pyproject = open(os.path.join(here, '..', 'pyproject.toml')).read()
    assert re.search(r'^version\s*=\s*"([^"]+)"', pyproject, re.M).group(1) == default
    assert idempo.__version__ == default == F.LIBRARY_VERSION
    assert F.supported(default)


def test_the_first_answer_is_what_jsonb_gives_back_without_parsing_it_again():
    # once() answers the first time with the result as its replay will read it (docs/python.md);
    # F.stored makes that copy directly for the plain types, and must agree with the JSON round
    # trip (as_stored) exactly: the same values, types and key order.
    values = [
        None, True, False, 0, -7, 2 ** 70, 'x', '', 'naïve ✓', 2.5, -0.0, 0.1, 1e16, 1.5e300, 1e-05, 1.25e-10, 123.0,
        [], (), [1, (2, 3)], {}, {'b': 1, 'a': 2, 'aa': 3, 'é': 4, 'z': 5}, {'reserved': 2},
        {'nested': {'zz': [1.0, {'y': None, 'x': True}], 'a': ()}, 'k': 'v'},
        {7: 'seven', 'ids': (1, 2)},              # not plain (an int key): parsed back
        {'m': {None: 1.0}}, {'f': float('inf')}, [float('nan')], {'t': True, 1: 2},
    ]
    for value in values:
        text = F.to_json(value)
        expected = F.as_stored(text)
        got = F.stored(value, text)
        assert repr(got) == repr(expected), value
        assert type(got) is type(expected)
        if isinstance(value, (list, dict)) and value:
            assert got is not value                 # a copy: changing the object set later changes no answer
