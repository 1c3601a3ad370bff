"""The console as a person uses it: a real browser (Debian's chromium, headless, driven by
Selenium), keyboard and forms only.  Each page the tests visit is checked with axe-core (no
serious or critical violation); the screenshots of docs/console.md are taken here
(IDEMPO_CONSOLE_SCREENSHOTS: the directory to write them to).

Needs python3-selenium, chromium, chromium-driver and axe-core's axe.min.js (IDEMPO_CONSOLE_AXE,
from npm's axe-core); without them the tests are skipped with the reason (and the run script
counts a skip as a failure)."""
import os
import shutil
import urllib.parse

import pytest

from conftest import PASSWORDS

webdriver = pytest.importorskip('selenium.webdriver', reason='python3-selenium is not installed')
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

AXE = os.environ.get('IDEMPO_CONSOLE_AXE', '')
SHOTS = os.environ.get('IDEMPO_CONSOLE_SCREENSHOTS', '')


@pytest.fixture
def browser():
    made = []

    def start(width=1200, height=900, phone=False):
        if not shutil.which('chromedriver') or not (shutil.which('chromium') or shutil.which('chromium-browser')):
            pytest.skip('chromium and chromium-driver are not installed')
        opts = webdriver.ChromeOptions()
        for a in ('--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
                  f'--window-size={width},{height}', '--force-device-scale-factor=1', '--lang=en'):
            opts.add_argument(a)
        if phone:       # headless windows are 500 pixels wide at least: a phone's screen is emulated
            opts.add_experimental_option('mobileEmulation', {'deviceMetrics': {'width': width, 'height': height,
                                                                              'pixelRatio': 1}})
        service = webdriver.ChromeService(executable_path=shutil.which('chromedriver')) \
            if hasattr(webdriver, 'ChromeService') else webdriver.chrome.service.Service(shutil.which('chromedriver'))
        d = webdriver.Chrome(service=service, options=opts)
        d.set_page_load_timeout(30)
        made.append(d)
        return d
    yield start
    for d in made:
        d.quit()


def check_accessibility(d):
    """axe-core in the page (injected by the driver, not by the page: the CSP allows no script)."""
    if not AXE:
        pytest.skip("IDEMPO_CONSOLE_AXE (npm's axe-core/axe.min.js) is not set")
    d.execute_script(open(AXE).read())
    result = d.execute_async_script("""const done = arguments[arguments.length - 1];
        axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations.map(
            v => ({id: v.id, impact: v.impact, nodes: v.nodes.map(n => n.target.join(' ')).slice(0, 3)}))));""")
    bad = [v for v in result if v['impact'] in ('serious', 'critical')]
    assert not bad, f'{d.current_url}: {bad}'


def shot(d, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        d.save_screenshot(os.path.join(SHOTS, name))


def type_into(d, element_id, text):
    e = d.find_element(By.ID, element_id)
    e.clear()
    e.send_keys(text)
    return e


def sign_in(d, console, role):
    d.get(console.url + '/')
    assert d.current_url.endswith('/login')
    check_accessibility(d)
    type_into(d, 'role', role)
    type_into(d, 'password', PASSWORDS[role]).send_keys(Keys.ENTER)      # the keyboard, no mouse
    assert d.find_element(By.ID, 'whoami').text == role


def tab_to(d, element_id, limit=200):
    """Moves the focus with the Tab key until it is on the element: keyboard-only use."""
    for _ in range(limit):
        if d.switch_to.active_element.get_attribute('id') == element_id:
            return d.switch_to.active_element
        d.switch_to.active_element.send_keys(Keys.TAB)
    raise AssertionError(f'{element_id} is not reached with the Tab key')


def choose(d, choice_id, limit=200):
    """Tab into the radio group, then the arrow keys to the choice (as a keyboard user does)."""
    group = d.find_element(By.ID, choice_id).get_attribute('name')
    form = d.find_element(By.ID, choice_id).find_element(By.XPATH, './ancestor::form')
    first = form.find_elements(By.CSS_SELECTOR, f'input[type=radio][name="{group}"]')[0].get_attribute('id')
    e = tab_to(d, first)
    e.send_keys(Keys.SPACE)
    for _ in range(limit):
        e = d.switch_to.active_element
        if e.get_attribute('id') == choice_id:
            assert e.is_selected()
            return
        e.send_keys(Keys.ARROW_DOWN)
    raise AssertionError(f'{choice_id} is not reached with the arrow keys')


def decide_by_keyboard(d, prefix, choice_id, note, target_ref=None, submit_id=None):
    """Fills a decision form with the keyboard: the choice, target_ref, note, confirmation."""
    d.find_element(By.TAG_NAME, 'body').click()
    choose(d, choice_id)
    if target_ref is not None:
        tab_to(d, f'{prefix}-target_ref').send_keys(target_ref)
    tab_to(d, f'{prefix}-note').send_keys(note)
    tab_to(d, f'{prefix}-confirm').send_keys(Keys.SPACE)
    tab_to(d, submit_id or f'{prefix}-submit').send_keys(Keys.ENTER)


def history(d):
    return [[td.text for td in tr.find_elements(By.TAG_NAME, 'td')]
            for tr in d.find_elements(By.CSS_SELECTOR, '#history tbody tr')]


def test_find_the_oldest_unknown_and_verify_it(data, console, browser):
    data.unknown('billing.charge', ['inv-1', 'inv-2', 'inv-3'])
    data.unknown('shop.order', ['order-1'])
    data.conflict('billing.charge', 'inv-9', {'amount': 10, 'currency': 'EUR'}, {'amount': 12, 'currency': 'EUR'})
    c = console()
    d = browser()
    sign_in(d, c, 'alice')
    check_accessibility(d)
    shot(d, 'console-overview.png')
    d.find_element(By.ID, 'oldest-unknown').click()
    assert d.find_element(By.ID, 'key').text == 'inv-1' and d.find_element(By.ID, 'status').text == 'unknown'
    check_accessibility(d)
    shot(d, 'console-record.png')
    decide_by_keyboard(d, 'verify', 'found-true', 'charge ch_1 seen in the provider', target_ref='ch_1')
    assert 'Verified (found)' in d.find_element(By.ID, 'done').text
    assert d.find_element(By.ID, 'status').text == 'succeeded'
    assert ['verify found', 'unknown', 'succeeded', '1', '', 'alice'] in [row[1:] for row in history(d)]
    assert data.status('billing.charge', 'inv-1') == 'succeeded'
    check_accessibility(d)
    # the queues, filtered by scope
    d.get(c.url + '/unknown?scope=billing.charge')
    check_accessibility(d)
    keys = [a.text for a in d.find_elements(By.CSS_SELECTOR, 'a.key')]
    assert keys == ['inv-2', 'inv-3']
    shot(d, 'console-unknown.png')
    d.get(c.url + '/conflicts')
    check_accessibility(d)


def test_resolve_a_conflict(data, console, browser):
    cid = data.conflict('billing.charge', 'inv-9', {'amount': 10, 'currency': 'EUR'}, {'amount': 12, 'currency': 'EUR'})
    c = console()
    d = browser()
    sign_in(d, c, 'alice')
    d.get(c.url + '/conflicts')
    d.find_element(By.LINK_TEXT, 'inv-9').click()
    differs = d.find_elements(By.CSS_SELECTOR, 'tr.differs th')
    assert [e.text for e in differs] == ['amount (differs)']
    check_accessibility(d)
    shot(d, 'console-conflict.png')
    decide_by_keyboard(d, f'c{cid}', f'c{cid}-kept_stored', 'the first order stands', submit_id=f'conflict-{cid}-submit')
    assert f'Conflict {cid} resolved: kept_stored' in d.find_element(By.ID, 'done').text
    assert data.one('SELECT resolved_by, resolution FROM idempo.conflicts WHERE id = %s', (cid,)) == ('alice', 'kept_stored')


def test_a_second_reviewers_stale_page_is_refused(data, console, browser):
    data.unknown('billing.charge', ['inv-1'])
    c = console()
    alice, carol = browser(), browser()
    sign_in(alice, c, 'alice')
    sign_in(carol, c, 'carol')
    path = '/record?' + urllib.parse.urlencode({'scope': 'billing.charge', 'key': 'inv-1'})
    alice.get(c.url + path)
    carol.get(c.url + path)
    decide_by_keyboard(carol, 'resolve', 'res-failed', 'declined by the provider')
    assert carol.find_element(By.ID, 'status').text == 'failed'
    # alice's page still shows the record unknown; her decision is refused, she sees the new state
    decide_by_keyboard(alice, 'resolve', 'res-succeeded', 'found it', target_ref='ch_1')
    assert 'changed since you read it' in alice.find_element(By.ID, 'message').text
    assert alice.find_element(By.ID, 'status').text == 'failed'
    check_accessibility(alice)
    shot(alice, 'console-stale.png')
    assert data.status('billing.charge', 'inv-1') == 'failed'
    assert ['resolve', 'unknown', 'failed', '1', '', 'carol'] in [row[1:] for row in history(alice)]


def test_a_role_without_rights_sees_nothing_of_other_scopes(data, console, browser):
    data.unknown('billing.charge', ['inv-1'])
    data.unknown('shop.order', ['order-1'])
    c = console()
    d = browser()
    sign_in(d, c, 'bob')
    for path in ('/', '/unknown', '/reviews', '/conflicts'):
        d.get(c.url + path)
        assert 'billing' not in d.page_source and 'inv-1' not in d.page_source, path
    d.get(c.url + '/unknown')
    assert [a.text for a in d.find_elements(By.CSS_SELECTOR, 'a.key')] == ['order-1']
    d.get(c.url + '/record?scope=billing.charge&key=inv-1')
    assert 'no such record' in d.find_element(By.CSS_SELECTOR, '.message').text
    check_accessibility(d)


def test_a_script_key_is_inert(data, console, browser):
    key = '<script>alert(1)</script><img src=x onerror=alert(2)>'
    data.unknown('billing.charge', [key])
    c = console()
    d = browser()
    sign_in(d, c, 'alice')
    d.get(c.url + '/unknown')
    link = d.find_element(By.CSS_SELECTOR, 'a.key')
    assert link.text == key
    link.click()
    assert d.find_element(By.ID, 'key').text == key
    try:
        d.switch_to.alert
        raise AssertionError('a script in a key ran')
    except NoAlertPresentException:
        pass
    assert not d.find_elements(By.CSS_SELECTOR, 'main script, main img')


def test_reads_on_a_phone(data, console, browser):
    data.unknown('billing.charge', ['inv-1'])
    c = console()
    d = browser(width=390, height=844, phone=True)
    sign_in(d, c, 'alice')
    d.get(c.url + '/record?scope=billing.charge&key=inv-1')
    # nothing wider than the screen but the tables' own scrolling boxes
    assert d.execute_script('return window.innerWidth') == 390
    assert d.execute_script('return document.documentElement.scrollWidth') <= 390
    check_accessibility(d)
    shot(d, 'console-phone.png')


def test_decide_fifty_at_once_with_one_changed_meanwhile(data, console, browser):
    data.unknown('billing.charge', [f'inv-{i:02}' for i in range(50)])
    c = console()
    d = browser()
    sign_in(d, c, 'alice')
    d.get(c.url + '/unknown?scope=billing.charge')
    check_accessibility(d)
    d.find_element(By.TAG_NAME, 'body').click()
    for i in range(1, 51):
        tab_to(d, f'pick-{i}').send_keys(Keys.SPACE)
    choose(d, 'bulk-not_executed')
    tab_to(d, 'bulk-submit').send_keys(Keys.ENTER)
    assert d.find_element(By.ID, 'count').text.startswith('50 record(s) selected')
    assert len(d.find_elements(By.CSS_SELECTOR, '#sample li')) == 11          # ten, and "40 more"
    check_accessibility(d)
    shot(d, 'console-bulk.png')
    # meanwhile carol decides one of them
    data.sql("SELECT idempo.resolve('billing.charge', 'inv-07', 'failed', 'carol', note => 'declined')", user='carol')
    tab_to(d, 'bulk-note').send_keys('none of them reached the provider')
    tab_to(d, 'bulk-confirm').send_keys(Keys.SPACE)
    tab_to(d, 'bulk-decide').send_keys(Keys.ENTER)
    assert '49 record(s) resolved as not_executed; 1 refused, not forced' in d.find_element(By.ID, 'done').text
    refused = d.find_elements(By.CSS_SELECTOR, '#refused tbody tr')
    assert len(refused) == 1 and 'inv-07' in refused[0].text and 'changed since you read it' in refused[0].text
    check_accessibility(d)
    assert data.status('billing.charge', 'inv-07') == 'failed'
    assert data.one("SELECT count(*) FROM idempo.operations WHERE status = 'retryable'")[0] == 49


def test_decide_every_record_a_filter_matches(data, console, browser):
    """Beyond the page: 120 records selected by their filter, counted and sampled, decided in
    chunks (the progress page goes on by itself, no script); one changed meanwhile is reported, and
    one that starts to match after the selection is left alone."""
    data.unknown('billing.charge', [f'inv-{i:03}' for i in range(120)])
    c = console()
    d = browser()
    sign_in(d, c, 'alice')
    d.get(c.url + '/unknown?scope=billing.charge')      # the focus at the page's start: no click
    tab_to(d, 'select-all').send_keys(Keys.ENTER)
    assert d.find_element(By.ID, 'count').text.startswith('120 record(s) selected')
    assert len(d.find_elements(By.CSS_SELECTOR, '#sample li')) == 21           # twenty, and "100 more"
    check_accessibility(d)
    shot(d, 'console-bulk-all.png')
    # meanwhile carol decides one of them, and a new record starts to match
    data.sql("SELECT idempo.resolve('billing.charge', 'inv-042', 'failed', 'carol', note => 'declined')", user='carol')
    data.unknown('billing.charge', ['inv-new'])
    choose(d, 'all-not_executed')
    tab_to(d, 'all-note').send_keys('the provider was down: none of them reached it')
    tab_to(d, 'all-confirm').send_keys(Keys.SPACE)
    tab_to(d, 'all-decide').send_keys(Keys.ENTER)
    # the progress pages follow one another (meta refresh) up to the result
    WebDriverWait(d, 120).until(lambda drv: drv.find_elements(By.ID, 'done'))
    assert '119 record(s) resolved as not_executed; 1 refused, not forced' in d.find_element(By.ID, 'done').text
    refused = d.find_elements(By.CSS_SELECTOR, '#refused tbody tr')
    assert len(refused) == 1 and 'inv-042' in refused[0].text and 'changed since you read it' in refused[0].text
    check_accessibility(d)
    assert data.status('billing.charge', 'inv-042') == 'failed' and data.status('billing.charge', 'inv-new') == 'unknown'
    assert data.one("SELECT count(*) FROM idempo.operations WHERE status = 'retryable'")[0] == 119
