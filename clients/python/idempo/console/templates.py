"""The console's pages (Jinja2, autoescaped) and its one style sheet: no script, no CDN."""

CSS = """
:root { --fg: #1b1b1b; --bg: #fff; --muted: #555; --line: #ccc; --accent: #0b4f8a; --warn: #8a1c0b; --ok: #1d5e20; }
* { box-sizing: border-box; }
body { font: 16px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); margin: 0; }
header { background: #14325a; color: #fff; padding: .5rem 1rem; display: flex; flex-wrap: wrap; gap: 1rem; align-items: center; }
header a { color: #fff; }
header nav ul { list-style: none; display: flex; flex-wrap: wrap; gap: 1rem; margin: 0; padding: 0; }
header form { margin-left: auto; }
main { padding: 1rem; max-width: 72rem; }
a { color: var(--accent); }
a:focus, button:focus, input:focus, select:focus, textarea:focus { outline: 3px solid #f5a623; outline-offset: 2px; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1rem; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid var(--line); vertical-align: top; }
.scroll { overflow-x: auto; }
code, .key { font-family: ui-monospace, monospace; word-break: break-all; }
.message { border-left: 4px solid var(--warn); background: #fbeeee; padding: .5rem 1rem; }
.done { border-left: 4px solid var(--ok); background: #eef7ee; padding: .5rem 1rem; }
fieldset { border: 1px solid var(--line); margin: 1rem 0; }
label { display: block; margin: .4rem 0 .1rem; }
label.inline { display: inline; }
input[type=text], input[type=password], textarea, select { font: inherit; padding: .3rem; width: 100%; max-width: 30rem; }
button { font: inherit; padding: .35rem .9rem; background: var(--accent); color: #fff; border: 0; border-radius: 3px; cursor: pointer; }
.muted { color: var(--muted); }
.differs { background: #fff4d6; }
svg.bars { max-width: 100%; }
@media (max-width: 40rem) { main { padding: .5rem; } th, td { padding: .25rem; } }
"""

BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{% block title %}{% endblock %} · idempo console</title>
<link rel="stylesheet" href="/console.css">{% block head %}{% endblock %}</head>
<body>
<header>
  <strong>idempo console</strong>
  {% if session %}
  <nav aria-label="Main"><ul>
    <li><a href="/">Overview</a></li>
    <li><a href="/reviews">Reviews</a></li>
    <li><a href="/conflicts">Conflicts</a></li>
    <li><a href="/unknown">Unknown</a></li>
  </ul></nav>
  <form method="post" action="/logout">
    <input type="hidden" name="csrf" value="{{ session.csrf }}">
    <span>Signed in as <strong id="whoami">{{ session.role }}</strong>{% if read_only %} (read-only){% endif %}</span>
    {% if not sso %}<button type="submit">Sign out</button>{% endif %}
  </form>
  {% endif %}
</header>
<main>
{% block main %}{% endblock %}
</main>
</body></html>
"""

LOGIN = """{% extends "base.html" %}{% block title %}Sign in{% endblock %}{% block main %}
<h1>Sign in</h1>
{% if message %}<p class="message" role="alert">{{ message }}</p>{% endif %}
{% if sso %}
<p>This console signs you in through your organisation's single sign-on: open it through the
address your administrator gave you.</p>
{% else %}
<p>Sign in with your own PostgreSQL role: what you see and decide is what that role may, and
idempo records you as the reviewer.</p>
<form method="post" action="/login">
  <input type="hidden" name="login_csrf" value="{{ login_csrf }}">
  <label for="role">Role</label>
  <input type="text" id="role" name="role" autocomplete="username" required>
  <label for="password">Password</label>
  <input type="password" id="password" name="password" autocomplete="current-password" required>
  <p><button type="submit">Sign in</button></p>
</form>
{% endif %}
{% endblock %}
"""

ERROR = """{% extends "base.html" %}{% block title %}Refused{% endblock %}{% block main %}
<h1>Refused</h1>
<p class="message" role="alert">{{ message }}</p>
<p><a href="/">Back to the overview</a></p>
{% endblock %}
"""

OVERVIEW = """{% extends "base.html" %}{% block title %}Overview{% endblock %}{% block main %}
<h1>Overview</h1>
<p>Signed in as <strong>{{ role }}</strong>; you see the scopes whose records your role reviews.</p>
<ul>
  <li>Oldest open review:
  {% if oldest %}<a href="/record?{{ {'scope': oldest.scope, 'key': oldest.key}|q }}">{{ oldest.scope }} / <span class="key">{{ oldest|short_key }}</span></a>, waiting {{ oldest.waiting|interval }}{% else %}none{% endif %}</li>
  <li>Oldest unknown operation:
  {% if oldest_unknown %}<a id="oldest-unknown" href="/record?{{ {'scope': oldest_unknown.scope, 'key': oldest_unknown.key}|q }}">{{ oldest_unknown.scope }} / <span class="key">{{ oldest_unknown.key[:16] }}</span></a>, in doubt for {{ oldest_unknown.waiting|interval }}{% else %}none{% endif %}</li>
</ul>
<h2>Scopes</h2>
<div class="scroll" tabindex="0" role="region" aria-label="Table, scrolls sideways"><table>
<caption class="muted">Records waiting, per scope</caption>
<thead><tr><th scope="col">Scope</th><th scope="col">In progress</th><th scope="col">Unknown</th><th scope="col">In review</th><th scope="col">Open reviews</th><th scope="col">Open conflicts</th><th scope="col">Oldest review waits</th><th scope="col">Waiting work</th></tr></thead>
<tbody>
{% for r in rows %}<tr>
  <th scope="row"><a href="/scopes/{{ r.scope|urlencode }}">{{ r.scope }}</a>{% if not r.enabled %} <span class="muted">(disabled)</span>{% endif %}</th>
  <td>{{ r.in_progress }}</td><td><a href="/unknown?{{ {'scope': r.scope}|q }}">{{ r.unknown }}</a></td><td>{{ r.in_review }}</td>
  <td><a href="/reviews?{{ {'scope': r.scope}|q }}">{{ r.open_reviews }}</a></td>
  <td><a href="/conflicts?{{ {'scope': r.scope}|q }}">{{ r.open_conflicts }}</a></td>
  <td>{{ r.oldest_review_wait|interval }}</td>
  <td><svg class="bars" width="160" height="14" role="img" aria-label="{{ r.in_progress }} in progress, {{ r.unknown }} unknown, {{ r.in_review }} in review, {{ r.open_conflicts }} conflicts">
    {% set w = 160 / top %}{% set x1 = r.in_progress * w %}{% set x2 = x1 + r.unknown * w %}{% set x3 = x2 + r.in_review * w %}
    <rect x="0" y="0" width="{{ x1 }}" height="14" fill="#6b8fb8"></rect>
    <rect x="{{ x1 }}" y="0" width="{{ x2 - x1 }}" height="14" fill="#b8860b"></rect>
    <rect x="{{ x2 }}" y="0" width="{{ x3 - x2 }}" height="14" fill="#8a1c0b"></rect>
    <rect x="{{ x3 }}" y="0" width="{{ r.open_conflicts * w }}" height="14" fill="#5a2d82"></rect>
  </svg></td>
</tr>{% else %}<tr><td colspan="8">No scope you may see.</td></tr>{% endfor %}
</tbody></table></div>
<p class="muted">Bars: in progress (blue), unknown (ochre), in review (red), open conflicts (purple).</p>
<h2>The last {{ days|length if days else 14 }} days</h2>
{% if days is none %}<p class="muted">The audit events cannot be read here (your role may not execute idempo.reviewable_events_since).</p>
{% else %}<div class="scroll" tabindex="0" role="region" aria-label="Table, scrolls sideways"><table id="activity">
<caption class="muted">Per day, oldest first, from the audit log of the scopes you review (scopes with audit on)</caption>
<thead><tr><th scope="col">What</th><th scope="col">Per day</th><th scope="col">Total</th><th scope="col">Today</th></tr></thead>
<tbody>
{% for c in charts %}<tr>
  <th scope="row">{{ c.label }}</th>
  <td><svg class="bars" width="{{ 8 * c.counts|length }}" height="24" role="img" aria-label="{{ c.label }} per day, oldest first: {{ c.counts|join(', ') }}">
  {% for n in c.counts %}<rect x="{{ 8 * loop.index0 }}" y="{{ 24 - (24 * n / c.top)|round(1) }}" width="6" height="{{ (24 * n / c.top)|round(1) }}" fill="#0b4f8a"><title>{{ days[loop.index0].day|day }}: {{ n }}</title></rect>
  {% endfor %}</svg></td>
  <td>{{ c.counts|sum }}</td><td>{{ c.counts|last }}</td>
</tr>{% endfor %}
</tbody></table></div>{% endif %}
<h2>Sweeper</h2>
{% if workers is none %}<p class="muted">idempo.workers() cannot be read here (your role may not call it, or the edition has no background worker).</p>
{% elif not workers %}<p class="message">No launcher or sweeper runs: records whose lease ran out are not moved, retention does not run out (is idempo in shared_preload_libraries?).</p>
{% else %}<table><thead><tr><th scope="col">Kind</th><th scope="col">State</th><th scope="col">Rounds</th><th scope="col">Last round</th></tr></thead><tbody>
{% for w in workers %}<tr><td>{{ w.kind }}</td><td>{{ w.state }}</td><td>{{ w.rounds if w.rounds is not none else '' }}</td><td>{{ w.last_round_at|ts }}</td></tr>{% endfor %}
</tbody></table>{% endif %}
{% endblock %}
"""

QUEUE = """{% extends "base.html" %}
{% block title %}{{ title }}{% endblock %}{% block main %}
<h1>{{ title }}</h1>
<form method="get" action="/{{ kind }}" aria-label="Filter">
  <label for="scope">Scope</label>
  <select id="scope" name="scope"><option value="">every scope</option>
  {% for s in scopes %}<option value="{{ s.name }}"{% if f.scope == s.name %} selected{% endif %}>{{ s.name }}</option>{% endfor %}
  </select>
  {% if kind == 'reviews' %}<label for="reason">Reason</label>
  <select id="reason" name="reason"><option value="">any reason</option>
  {% for r in ['retention_expired', 'stale_retry', 'attempts_exhausted', 'manual'] %}<option{% if f.reason == r %} selected{% endif %}>{{ r }}</option>{% endfor %}
  </select>{% endif %}
  <label for="older_than">Waiting at least (minutes)</label>
  <input type="text" id="older_than" name="older_than" inputmode="numeric" value="{{ f.older_than or '' }}">
  <label for="q">Key (begins with; in hash_keys scopes the whole key, compared by its digest)</label>
  <input type="text" id="q" name="q" value="" autocomplete="off">
  {% if f.q %}<span class="muted">(results for the key you searched for; not shown again: it may be one a scope keeps only as a digest)</span>{% endif %}
  <p><button type="submit">Filter</button></p>
</form>
{% if picks %}<form method="post" action="/bulk" id="bulk">
<input type="hidden" name="csrf" value="{{ session.csrf }}">
<input type="hidden" name="step" value="review">{% endif %}
<div class="scroll" tabindex="0" role="region" aria-label="Table, scrolls sideways"><table>
<thead><tr>{% if picks %}<th scope="col">Select</th>{% endif %}<th scope="col">Scope</th><th scope="col">Key</th>
{% if kind == 'reviews' %}<th scope="col">Reason</th><th scope="col">Status</th>{% elif kind == 'conflicts' %}<th scope="col">Occurrences</th><th scope="col">Fields that differ</th>{% else %}<th scope="col">Attempt</th>{% endif %}
<th scope="col">Waiting</th></tr></thead><tbody>
{% for r in rows %}<tr>
  {% if picks %}<td>{% set t = picks.get((r.scope, r.key)) %}{% if t %}<input type="checkbox" name="pick" id="pick-{{ loop.index }}" value='{{ ([r.scope, r.key, t, r.id] if kind == 'conflicts' else [r.scope, r.key, t])|tojson }}' aria-label="Select {{ r.scope }} {{ r|short_key }}{% if kind == 'conflicts' %} conflict {{ r.id }}{% endif %}">{% endif %}</td>{% endif %}
  <td>{{ r.scope }}</td>
  <td><a class="key" href="/record?{{ {'scope': r.scope, 'key': r.key}|q }}">{{ r|short_key }}</a></td>
  {% if kind == 'reviews' %}<td>{{ r.reason }}</td><td>{{ r.status or 'gone' }}</td>
  {% elif kind == 'conflicts' %}<td>{{ r.occurrences }}</td><td>{% for c in r.changed_fields or [] %}{{ c.field }}{% if not loop.last %}, {% endif %}{% endfor %}</td>
  {% else %}<td>{{ r.attempt }}</td>{% endif %}
  <td>{{ r.waiting|interval }}</td>
</tr>{% else %}<tr><td colspan="6">Nothing waits here.</td></tr>{% endfor %}
</tbody></table></div>
{% if picks %}<fieldset><legend>Decide the selected {{ 'conflicts' if kind == 'conflicts' else 'records' }} at once</legend>
  {% if kind == 'conflicts' %}
  <p><input type="radio" id="bulk-kept_stored" name="resolution" value="kept_stored" required> <label class="inline" for="bulk-kept_stored">Kept stored: the stored requests stand</label></p>
  <p><input type="radio" id="bulk-new_key" name="resolution" value="new_key"> <label class="inline" for="bulk-new_key">New key: the new requests were sent again under new keys</label></p>
  <p><input type="radio" id="bulk-dismissed" name="resolution" value="dismissed"> <label class="inline" for="bulk-dismissed">Dismissed</label></p>
  {% else %}
  <p><input type="radio" id="bulk-not_executed" name="resolution" value="not_executed" required> <label class="inline" for="bulk-not_executed">They were not executed (may run again)</label></p>
  <p><input type="radio" id="bulk-failed" name="resolution" value="failed"> <label class="inline" for="bulk-failed">They failed (final)</label></p>
  <p class="muted">A success names its target_ref: decide those one by one. Records of hash_keys scopes too (their key is typed in clear).</p>
  {% endif %}
  <button type="submit" id="bulk-submit">Review the selection</button>
</fieldset></form>{% endif %}
{% if picks and rows %}<form method="post" action="/bulk/all" id="select-all-form">
  <input type="hidden" name="csrf" value="{{ session.csrf }}">
  <input type="hidden" name="kind" value="{{ kind }}">
  {% for k in ['scope', 'reason', 'q', 'older_than'] %}{% if f[k] %}<input type="hidden" name="{{ k }}" value="{{ f[k] }}">{% endif %}{% endfor %}
  <p><button type="submit" id="select-all">Select every {{ 'conflict' if kind == 'conflicts' else 'record' }} this filter matches{% if next %} (beyond this page){% endif %}</button>
  <span class="muted">at most {{ '{:,}'.format(max_all) }} at once; you see how many and a sample before anything is decided</span></p>
</form>{% endif %}
{% if next %}<p><a href="/{{ kind }}?{{ next|q }}" rel="next">Next page</a></p>{% endif %}
{% endblock %}
"""

RECORD = """{% extends "base.html" %}{% block title %}Record{% endblock %}{% block main %}
{% set op = rec.op %}{% set sc = rec.scope %}
<h1>Record in <a href="/scopes/{{ sc.name|urlencode }}">{{ sc.name }}</a></h1>
{% if message %}<p class="message" role="alert" id="message">{{ message }}</p>{% endif %}
{% if done %}<p class="done" role="status" id="done">{{ done }}</p>{% endif %}
<dl>
  <dt>Key{% if sc.hash_keys %} (digest: this scope stores no key in clear){% endif %}</dt><dd class="key" id="key">{{ key }}</dd>
  {% if op %}
  <dt>Status</dt><dd id="status">{{ op.status }}</dd>
  <dt>Attempt</dt><dd>{{ op.attempt }}{% if op.attempt_base %} (attempts up to {{ op.attempt_base }} granted again){% endif %}</dd>
  <dt>First seen</dt><dd>{{ op.first_seen_at|ts }}</dd>
  <dt>Last attempt</dt><dd>{{ op.last_attempt_at|ts }}</dd>
  {% if op.target_ref %}<dt>target_ref</dt><dd class="key">{{ op.target_ref }}</dd>{% endif %}
  {% if op.result is not none %}<dt>Stored result</dt><dd><code>{{ op.result|tojson }}</code></dd>{% endif %}
  {% if op.error %}<dt>Error</dt><dd>{{ op.error }}</dd>{% endif %}
  {% if op.params is not none %}<dt>Params</dt><dd><code>{{ op.params|tojson }}</code></dd>{% endif %}
  {% else %}<dt>Status</dt><dd id="status">no record (purged)</dd>{% endif %}
  {% if sc.fingerprint_include %}<dt>Fingerprint counts only</dt><dd>{{ sc.fingerprint_include|join(', ') }}</dd>{% endif %}
  {% if sc.fingerprint_ignore %}<dt>Fingerprint ignores</dt><dd>{{ sc.fingerprint_ignore|join(', ') }}</dd>{% endif %}
  {% if rec.review %}<dt>Open review</dt><dd>{{ rec.review.reason }}, waiting {{ rec.review.waiting|interval }}{% if rec.review.detail %}: {{ rec.review.detail }}{% endif %}</dd>{% endif %}
</dl>

{% macro common(action, prefix) %}
  <input type="hidden" name="csrf" value="{{ session.csrf }}">
  <input type="hidden" name="action" value="{{ action }}">
  <input type="hidden" name="scope" value="{{ sc.name }}">
  <input type="hidden" name="key" value="{{ key }}">
  <input type="hidden" name="token" value="{{ rec.token }}">
  {% if sc.hash_keys and action != 'resolve_conflict' %}
  <label for="{{ prefix }}-clear">The key in clear (this scope stores only its digest)</label>
  <input type="text" id="{{ prefix }}-clear" name="clear_key" autocomplete="off" required>{% endif %}
{% endmacro %}
{% macro confirm(prefix) %}
  <label for="{{ prefix }}-note">Note (required: why)</label>
  <textarea id="{{ prefix }}-note" name="note" rows="2" required></textarea>
  <p><input type="checkbox" id="{{ prefix }}-confirm" name="confirm" value="yes" required>
  <label class="inline" for="{{ prefix }}-confirm">I have checked this decision; record it as mine ({{ session.role }})</label></p>
{% endmacro %}

{% if not read_only %}
{% if op and op.status == 'unknown' %}
<form method="post" action="/decide"><fieldset><legend>Verify attempt {{ op.attempt }} in the target system</legend>
  {{ common('verify', 'verify') }}
  <p><input type="radio" id="found-true" name="found" value="true" required> <label class="inline" for="found-true">Found: it happened</label></p>
  <p><input type="radio" id="found-false" name="found" value="false"> <label class="inline" for="found-false">Not found: it did not happen (counts only after the settle window)</label></p>
  <label for="verify-target_ref">target_ref (when found)</label><input type="text" id="verify-target_ref" name="target_ref">
  {{ confirm('verify') }}
  <button type="submit" id="verify-submit">Verify</button>
</fieldset></form>
{% endif %}
{% if op and op.status in ('unknown', 'in_review') %}
<form method="post" action="/decide"><fieldset><legend>Resolve</legend>
  {{ common('resolve', 'resolve') }}
  <p><input type="radio" id="res-succeeded" name="resolution" value="succeeded" required> <label class="inline" for="res-succeeded">It succeeded</label></p>
  <p><input type="radio" id="res-not_executed" name="resolution" value="not_executed"> <label class="inline" for="res-not_executed">It was not executed (may run again)</label></p>
  <p><input type="radio" id="res-failed" name="resolution" value="failed"> <label class="inline" for="res-failed">It failed (final)</label></p>
  <label for="resolve-target_ref">target_ref (required for succeeded)</label><input type="text" id="resolve-target_ref" name="target_ref">
  {{ confirm('resolve') }}
  <button type="submit" id="resolve-submit">Resolve</button>
</fieldset></form>
{% endif %}
{% if op and op.status != 'in_review' and not rec.review and not op.remembered %}
<form method="post" action="/decide"><fieldset><legend>Put in review (a person must decide)</legend>
  {{ common('request_review', 'review') }}
  {{ confirm('review') }}
  <button type="submit" id="review-submit">Put in review</button>
</fieldset></form>
{% endif %}
{% if op and op.remembered %}
<form method="post" action="/decide"><fieldset><legend>Release this remembered key (the action may run again)</legend>
  {{ common('release', 'release') }}
  {{ confirm('release') }}
  <button type="submit" id="release-submit">Release</button>
</fieldset></form>
{% endif %}
{% endif %}

{% for c in rec.conflicts %}
<section aria-labelledby="conflict-{{ c.id }}">
<h2 id="conflict-{{ c.id }}">Conflict {{ c.id }}: {{ c.occurrences }} request(s) with other params</h2>
<p>First {{ c.first_detected_at|ts }}, waiting {{ c.waiting|interval }}.</p>
{% set changed = (c.changed_fields or [])|map(attribute='field')|list %}
{% if c.stored_params is not none or c.incoming_params is not none %}
<div class="scroll" tabindex="0" role="region" aria-label="Table, scrolls sideways"><table><caption class="muted">Stored and new request side by side; the fields that differ are marked</caption>
<thead><tr><th scope="col">Field</th><th scope="col">Stored</th><th scope="col">New</th></tr></thead><tbody>
{% set sp = c.stored_params if c.stored_params is mapping else {} %}{% set ip = c.incoming_params if c.incoming_params is mapping else {} %}
{% for f in (sp.keys()|list + ip.keys()|list)|unique|sort %}
<tr{% if f in changed %} class="differs"{% endif %}><th scope="row">{{ f }}{% if f in changed %} (differs){% endif %}</th>
<td><code>{{ sp[f]|tojson if f in sp else '—' }}</code></td><td><code>{{ ip[f]|tojson if f in ip else '—' }}</code></td></tr>
{% endfor %}</tbody></table></div>
{% else %}<p class="muted">The scope does not store params: only the fingerprints are known.</p>{% endif %}
{% if not read_only %}
<form method="post" action="/decide"><fieldset><legend>Resolve conflict {{ c.id }}</legend>
  {{ common('resolve_conflict', 'c' ~ c.id) }}
  <input type="hidden" name="conflict_id" value="{{ c.id }}">
  <p><input type="radio" id="c{{ c.id }}-kept_stored" name="resolution" value="kept_stored" required> <label class="inline" for="c{{ c.id }}-kept_stored">Kept stored: the stored request stands</label></p>
  <p><input type="radio" id="c{{ c.id }}-new_key" name="resolution" value="new_key"> <label class="inline" for="c{{ c.id }}-new_key">New key: the new request was sent again under a new key</label></p>
  <p><input type="radio" id="c{{ c.id }}-dismissed" name="resolution" value="dismissed"> <label class="inline" for="c{{ c.id }}-dismissed">Dismissed</label></p>
  {{ confirm('c' ~ c.id) }}
  <button type="submit" id="conflict-{{ c.id }}-submit">Resolve conflict</button>
</fieldset></form>
{% endif %}
</section>
{% endfor %}

<h2>History</h2>
{% if rec.events is none %}<p class="muted">Your role may not read the audit events (idempo.reviewable_events_of).</p>
{% elif not rec.events %}<p class="muted">No events{% if not sc.audit %} (the scope is not audited){% endif %}.</p>
{% else %}<div class="scroll" tabindex="0" role="region" aria-label="Table, scrolls sideways"><table id="history"><thead><tr><th scope="col">When</th><th scope="col">Action</th><th scope="col">From</th><th scope="col">To</th><th scope="col">Attempt</th><th scope="col">Outcome</th><th scope="col">By</th></tr></thead><tbody>
{% for e in rec.events %}<tr><td>{{ e.at|ts }}</td><td>{{ e.action }}</td><td>{{ e.from_status or '' }}</td><td>{{ e.to_status or '' }}</td><td>{{ e.attempt if e.attempt is not none else '' }}</td><td>{{ e.outcome or '' }}</td><td>{{ e.actor }}</td></tr>{% endfor %}
</tbody></table></div>{% endif %}
{% endblock %}
"""

SCOPE = """{% extends "base.html" %}{% block title %}Scope{% endblock %}{% block main %}
<h1>Scope {{ sc.name }}</h1>
{% if done %}<p class="done" role="status" id="done">{{ done }}</p>{% endif %}
{% if sc.description %}<p>{{ sc.description }}</p>{% endif %}
<p><a href="/reviews?{{ {'scope': sc.name}|q }}">Open reviews</a> · <a href="/conflicts?{{ {'scope': sc.name}|q }}">Open conflicts</a> · <a href="/unknown?{{ {'scope': sc.name}|q }}">Unknown</a></p>
<table><tbody>
{% for k in ['enabled', 'owner', 'environment', 'allowed_role', 'retention', 'lease', 'on_lease_expiry', 'verify_settle', 'max_attempts', 'hash_keys', 'store_params', 'audit', 'durability', 'remember', 'fingerprint_ignore', 'fingerprint_include'] %}
<tr><th scope="row">{{ k }}</th><td>{{ sc[k] if sc[k] is not none else '' }}</td></tr>{% endfor %}
</tbody></table>
{% endblock %}
"""

BULK = """{% extends "base.html" %}{% from "refused.html" import refused_table %}{% block title %}Decide many{% endblock %}{% block main %}
{% set what = 'conflict(s)' if kind == 'conflicts' else 'record(s)' %}
{% if result %}
<h1>Decided: {{ result.decided|length }} of {{ picks|length }}</h1>
<p class="done" role="status" id="done">{{ result.decided|length }} {{ what }} resolved as {{ resolution }}{% if result.refused %}; {{ result.refused|length }} refused, not forced{% endif %}.</p>
{{ refused_table(result.refused) }}
{% else %}
<h1>Resolve {{ picks|length }} {{ what }} as {{ resolution }}</h1>
{% if message %}<p class="message" role="alert" id="message">{{ message }}</p>{% endif %}
<p id="count">{{ picks|length }} {{ what }} selected. Each is resolved only if it is still in the state it was selected in; the others are listed, not forced.</p>
<h2>Sample</h2>
<ul id="sample">{% for p in picks[:10] %}<li>{{ p[0] }} / <a class="key" href="/record?{{ {'scope': p[0], 'key': p[1]}|q }}">{{ p[1] }}</a>{% if p|length > 3 %} (conflict {{ p[3] }}){% endif %}</li>{% endfor %}
{% if picks|length > 10 %}<li>and {{ picks|length - 10 }} more</li>{% endif %}</ul>
<form method="post" action="/bulk"><fieldset><legend>One note for all</legend>
  <input type="hidden" name="csrf" value="{{ session.csrf }}">
  <input type="hidden" name="step" value="decide">
  <input type="hidden" name="resolution" value="{{ resolution }}">
  {% for p in picks %}<input type="hidden" name="pick" value='{{ p|list|tojson }}'>
  {% endfor %}
  <label for="bulk-note">Note (required: why)</label>
  <textarea id="bulk-note" name="note" rows="2" required></textarea>
  <p><input type="checkbox" id="bulk-confirm" name="confirm" value="yes" required>
  <label class="inline" for="bulk-confirm">I have checked these {{ picks|length }} decisions; record them as mine ({{ session.role }})</label></p>
  <button type="submit" id="bulk-decide">Resolve {{ picks|length }} {{ what }}</button>
</fieldset></form>
{% endif %}
{% endblock %}
"""

# the refused records of a decision on many: (scope, key, conflict id or None, why)
REFUSED = """{% macro refused_table(refused) %}{% if refused %}<h2>Refused</h2>
<div class="scroll" tabindex="0" role="region" aria-label="Refused records"><table id="refused"><thead><tr><th scope="col">Scope</th><th scope="col">Key</th><th scope="col">Why</th></tr></thead><tbody>
{% for scope, key, cid, why in refused %}<tr><td>{{ scope }}</td><td><a class="key" href="/record?{{ {'scope': scope, 'key': key}|q }}">{{ key }}</a>{% if cid %} (conflict {{ cid }}){% endif %}</td><td>{{ why }}</td></tr>{% endfor %}
</tbody></table></div>{% endif %}{% endmacro %}
"""

RUN = """{% extends "base.html" %}{% from "refused.html" import refused_table %}{% block title %}Decide all that match{% endblock %}
{% block head %}{% if run.note is not none and run.position < run.items|length %}<meta http-equiv="refresh" content="0; url=/bulk/run?run={{ run.id }}">{% endif %}{% endblock %}
{% block main %}
{% set what = 'conflict(s)' if run.kind == 'conflicts' else 'record(s)' %}
{% if run.note is none %}
<h1>Decide every {{ 'conflict' if run.kind == 'conflicts' else 'record' }} the filter matches</h1>
{% if message %}<p class="message" role="alert" id="message">{{ message }}</p>{% endif %}
<p id="count">{{ run.count }} {{ what }} selected{% if run.more %}: more than {{ '{:,}'.format(max_all) }} match, the {{ '{:,}'.format(max_all) }} oldest are selected (select again for the rest){% endif %}.
At most {{ '{:,}'.format(max_all) }} are decided at once.
Each is decided only if it is still in the state it was in when selected: the ones that changed are listed, not forced, and the ones that start to match from now on are left alone.</p>
<p id="filter">The filter: {{ TITLES[run.kind]|lower }}{% set fl = run.filters %}{% if fl.get("scope") %}, scope {{ fl.scope }}{% endif %}{% if fl.get("reason") %}, reason {{ fl.reason }}{% endif %}{% if fl.get("older_than") %}, waiting at least {{ fl.older_than }} min{% endif %}{% if fl.get("q") %}, the key searched for{% endif %}.</p>
{% if run.left_out %}<p id="left-out" class="muted">{{ run.left_out }} record(s) of hash_keys scopes are not selected: their key is typed in clear, one by one.</p>{% endif %}
<h2>Sample (the first {{ [20, run.items|length]|min }})</h2>
<ul id="sample">{% for sc, key, t, cids in run.items[:20] %}<li>{{ sc }} / <a class="key" href="/record?{{ {'scope': sc, 'key': key}|q }}">{{ key }}</a>{% if cids %} (conflict {{ cids|join(', ') }}){% endif %}</li>{% endfor %}
{% if run.items|length > 20 %}<li>and {{ run.items|length - 20 }} more record(s)</li>{% endif %}</ul>
<form method="post" action="/bulk/run" id="all-form"><fieldset><legend>Decide them: one note for all</legend>
  <input type="hidden" name="csrf" value="{{ session.csrf }}">
  <input type="hidden" name="run" value="{{ run.id }}">
  <input type="hidden" name="step" value="start">
  {% for r in resolutions %}<p><input type="radio" id="all-{{ r }}" name="resolution" value="{{ r }}"{% if loop.first %} required{% endif %}> <label class="inline" for="all-{{ r }}">{{ {'not_executed': 'They were not executed (may run again)', 'failed': 'They failed (final)', 'kept_stored': 'Kept stored: the stored requests stand', 'new_key': 'New key: the new requests were sent again under new keys', 'dismissed': 'Dismissed'}[r] }}</label></p>
  {% endfor %}
  <label for="all-note">Note (required: why)</label>
  <textarea id="all-note" name="note" rows="2" required></textarea>
  <p><input type="checkbox" id="all-confirm" name="confirm" value="yes" required>
  <label class="inline" for="all-confirm">I have checked these {{ run.count }} decisions; record them as mine ({{ session.role }})</label></p>
  <button type="submit" id="all-decide">Decide {{ run.count }} {{ what }}</button>
</fieldset></form>
{% elif run.position < run.items|length %}
<h1>Deciding {{ run.count }} {{ what }} as {{ run.resolution }}</h1>
<p role="status" id="progress">{{ run.decided|length }} decided and {{ run.refused|length }} refused so far; {{ run.items|length - run.position }} record(s) to go.</p>
<p><progress max="{{ run.items|length }}" value="{{ run.position }}" aria-label="Records done">{{ run.position }} of {{ run.items|length }}</progress></p>
<p class="muted">This page goes on by itself. If it stops, continue with the button: only the selection you confirmed is decided.</p>
<form method="post" action="/bulk/run" id="continue-form">
  <input type="hidden" name="csrf" value="{{ session.csrf }}">
  <input type="hidden" name="run" value="{{ run.id }}">
  <button type="submit" id="all-continue">Continue</button>
</form>
{% else %}
<h1>Decided: {{ run.decided|length }} of {{ run.count }}</h1>
<p class="done" role="status" id="done">{{ run.decided|length }} {{ what }} resolved as {{ run.resolution }}{% if run.refused %}; {{ run.refused|length }} refused, not forced{% endif %}.</p>
{{ refused_table(run.refused) }}
<p><a href="/{{ run.kind }}">Back to the queue</a></p>
{% endif %}
{% endblock %}
"""

TEMPLATES = {'base.html': BASE, 'login.html': LOGIN, 'error.html': ERROR, 'overview.html': OVERVIEW,
             'queue.html': QUEUE, 'record.html': RECORD, 'scope.html': SCOPE, 'bulk.html': BULK,
             'run.html': RUN, 'refused.html': REFUSED}
