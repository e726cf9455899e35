"""test_page.py — the page of `berth serve` in a real browser: headless Chromium (Debian's
/usr/bin/chromium) driven by Debian's python3-selenium through Debian's /usr/bin/chromedriver,
against a real `berth serve` that starts a real sandboxd (provider $BERTH_PROVIDER, default
bwrap) with the scripted model: each message is run as a Python cell.  Prints cmocka-style
lines for tests/run.sh (tests/test_browser.sh runs it).

    BUILD=build-x /usr/bin/python3 tests/browser/test_page.py      # TEST_FILTER='test_a_cell*'

Nothing is downloaded: the driver is given by its path, so Selenium Manager (which fetches
drivers) is never consulted, and Chromium runs with its background networking off.
Screenshots at 1280 and 360 px wide go to $BUILD/browser/.  Every wait ends on something
the page or the server shows (bounded by a timeout), never on a sleep.
"""
import fnmatch
import http.client
import json
import os
import queue
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse

os.environ["SE_OFFLINE"] = "true"   # newer Seleniums: never fetch a driver or a browser
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common import selenium_manager  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def _no_selenium_manager(self, *args, **kwargs):
    raise RuntimeError("Selenium Manager would download a driver: refused")


# Selenium 4.8 consults it only when the driver is not at its path; make that an error.
selenium_manager.SeleniumManager.driver_location = _no_selenium_manager

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
PROVIDER = os.environ.get("BERTH_PROVIDER", "bwrap")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
SHOTS = os.path.join(BUILD, "browser")
WAIT = 20   # seconds

# Each message is a cell: the scripted model runs the user's text as Python.
SCRIPT = """return { template = true, loop = true, turns = {
  { user = "*", replies = { { say = "Running your code.", call = { code = "{{user}}" } },
                            { say = "Done." } } } } }
"""

tokens = [secrets.token_hex(16), secrets.token_hex(16)]
work = server = driver = None


class CheckFailed(Exception):
    pass


def check(cond, what):
    if not cond:
        raise CheckFailed("check failed: " + what)


# {====================================================== the server and the browser

class Server:
    def __init__(self):
        self.url = None
        with open(os.path.join(work, "tokens"), "w") as f:
            f.write("# two callers\n" + "\n".join(tokens) + "\n")
        with open(os.path.join(work, "model.lua"), "w") as f:
            f.write(SCRIPT)
        args = [os.path.join(BUILD, "berth"), "serve", "--listen", "127.0.0.1:0",
                "--token-file", os.path.join(work, "tokens"),
                "--model", "scripted:" + os.path.join(work, "model.lua"), "--state-dir", work,
                "--sandboxd", os.path.join(BUILD, "sandboxd"), "--provider", PROVIDER,
                "--idle-timeout", "1"]
        self.log = open(os.path.join(work, "serve.log"), "w")
        self.child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=self.log, text=True)
        # A thread reads its stdout to the end, so serve never blocks on a full pipe.
        lines = queue.Queue()

        def pump():
            for line in self.child.stdout:
                lines.put(line)
            lines.put(None)
        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + WAIT
        while self.url is None:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("berth serve did not start")
            if line is None:
                raise RuntimeError("berth serve exited: %s\n%s" % (self.child.wait(), log_tail()))
            m = re.match(r"^listening (http://\S+)", line)
            if m:
                self.url = m.group(1)


def log_tail():
    with open(os.path.join(work, "serve.log")) as f:
        return f.read()[-3000:]


class Response:
    def __init__(self, status, headers, text):
        self.status, self.headers, self.text = status, headers, text
        try:
            self.json = json.loads(text)
        except ValueError:
            self.json = None


def call(method, url, token=None, body=None, headers=None):
    """One HTTP request, as a script (not the page) makes it."""
    u = urllib.parse.urlsplit(url)
    h = dict(headers or {})
    if token:
        h["Authorization"] = "Bearer " + token
    data = None
    if body is not None:
        h["Content-Type"] = "application/json"
        data = json.dumps(body)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=WAIT)
    try:
        conn.request(method, u.path or "/", body=data, headers=h)
        res = conn.getresponse()
        text = res.read().decode("utf-8", "replace")
        return Response(res.status, res.headers, text)
    finally:
        conn.close()


def start_browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars",
                "--disable-extensions", "--disable-default-apps", "--no-default-browser-check",
                "--disable-domain-reliability", "--disable-client-side-phishing-detection",
                # No name leaves the browser (it would look up Google's sign-in and update
                # hosts and the default search engine): the page is at 127.0.0.1.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--window-size=1280,900",
                "--user-data-dir=" + os.path.join(work, "chromium")]:
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})   # console and page errors
    service = Service(executable_path=CHROMEDRIVER, log_path=os.path.join(work, "driver.log"))
    return webdriver.Chrome(service=service, options=opts)


class Page:
    """One tab (its own sessionStorage), sized like puppeteer's setViewport."""

    def __init__(self, width=1280):
        driver.switch_to.new_window("tab")
        self.handle = driver.current_window_handle
        self.set_viewport(width, 900)
        driver.get_log("browser")   # what earlier tabs logged is theirs

    def set_viewport(self, width, height):
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        self.viewport = (width, height)

    def problems(self):
        """Uncaught errors and console.error lines, as puppeteer's pageerror and console."""
        out = []
        for e in driver.get_log("browser"):
            if e.get("level") != "SEVERE":
                continue
            msg = e.get("message", "")
            if e.get("source") == "javascript":
                out.append("page error: " + msg)
            elif e.get("source") == "console-api" and \
                    not re.search(r"401|404|Unauthorized|Not Found", msg):
                out.append("console error: " + msg)
        return out

    def js(self, script, *args):
        return driver.execute_script(script, *args)

    def eval(self, selector, body, *args):
        """body is a function of the first element that matches (like $eval)."""
        return self.js("const e = document.querySelector(arguments[0]);"
                       "if (!e) throw new Error('no ' + arguments[0]);"
                       "return (" + body + ")(e, ...Array.from(arguments).slice(1));",
                       selector, *args)

    def eval_all(self, selector, body):
        """body is a function of the array of matching elements (like $$eval)."""
        return self.js("return (" + body + ")(Array.from(document.querySelectorAll("
                       "arguments[0])));", selector)

    def wait(self, script, *args, what=""):
        """Until the page's script returns true (the page is polled, as waitForFunction)."""
        try:
            WebDriverWait(driver, WAIT, poll_frequency=0.05).until(
                lambda d: d.execute_script("return !!(" + script + ");", *args))
        except Exception:
            raise CheckFailed("timed out waiting for " + (what or script))

    def wait_visible(self, selector):
        # As puppeteer's {visible: true}: in the page, not visibility:hidden, with a box.
        self.wait("(function(e){ if (!e || getComputedStyle(e).visibility === 'hidden')"
                  " return false; const r = e.getBoundingClientRect();"
                  " return r.width > 0 || r.height > 0; })"
                  "(document.querySelector(arguments[0]))", selector,
                  what=selector + " visible")

    def goto(self, url):
        driver.get(url)   # returns once the page has loaded

    def reload(self):
        driver.refresh()

    def keys(self, *keys):
        ActionChains(driver).send_keys(*keys).perform()

    def type(self, text):
        self.keys(text)

    def focus(self, selector):
        self.eval(selector, "(e) => e.focus()")

    def shot(self, name):
        os.makedirs(SHOTS, exist_ok=True)
        # The whole page in one viewport, so that the sticky message box sits at its end.
        width, height = self.viewport
        full = self.js("return document.documentElement.scrollHeight")
        self.set_viewport(width, max(height, full))
        driver.save_screenshot(os.path.join(SHOTS, name))
        self.set_viewport(width, height)

    def close(self):
        driver.close()
        driver.switch_to.window(driver.window_handles[0])


def sign_in(page, token):
    page.goto(server.url + "/")
    page.wait_visible("#token")
    # The page puts the focus in the token field: type there, Enter submits.
    page.type(token)
    page.keys(Keys.ENTER)


def new_conversation_by_keyboard(page):
    """Keyboard only: Tab to "New conversation", Enter; the page focuses the message box."""
    for _ in range(12):
        page.keys(Keys.TAB)
        if page.js("return document.activeElement && document.activeElement.id") == "new-conv":
            break
    check(page.js("return document.activeElement.id === 'new-conv'"),
          '"New conversation" is reachable with Tab')
    page.keys(Keys.ENTER)
    page.wait("document.activeElement && document.activeElement.id === 'composer-text' &&"
              " !document.activeElement.disabled", what="the message box focused")
    return page.js("return sessionStorage.getItem('berth.conv')")


def send_by_keyboard(page, text):
    page.type(text)
    ActionChains(driver).key_down(Keys.CONTROL).send_keys(Keys.ENTER) \
        .key_up(Keys.CONTROL).perform()


def turn_ends(page):
    """The number of finished turns the log shows."""
    return page.js("return document.querySelectorAll('#log .turn-end').length")


def wait_turn_ends(page, n):
    page.wait("document.querySelectorAll('#log .turn-end').length >= arguments[0]", n,
              what="%d turn end(s)" % n)

# }======================================================


# {====================================================== the tests

def page_is_served_with_types_etag_and_a_strict_csp():
    page = call("GET", server.url + "/")
    check(page.status == 200, "GET / answers 200, with no token")
    check(re.match(r"text/html", page.headers.get("content-type") or ""), "the page is text/html")
    csp = page.headers.get("content-security-policy") or ""
    check(re.search(r"default-src 'none'", csp) and re.search(r"script-src 'self'", csp) and
          "unsafe-inline" not in csp, "a strict Content-Security-Policy: " + csp)
    check(page.headers.get("x-content-type-options") == "nosniff", "nosniff")
    check("/app.js" in page.text and not re.search(r"<script>[^<]", page.text),
          "no inline script")
    js = call("GET", server.url + "/app.js")
    check(js.status == 200 and re.match(r"text/javascript", js.headers.get("content-type") or ""),
          "app.js")
    css = call("GET", server.url + "/style.css")
    check(css.status == 200 and re.match(r"text/css", css.headers.get("content-type") or ""),
          "style.css")
    etag = css.headers.get("etag")
    check(etag, "style.css has an ETag")
    again = call("GET", server.url + "/style.css", headers={"If-None-Match": etag})
    check(again.status == 304, "If-None-Match with its ETag answers 304, not %d" % again.status)
    post = call("POST", server.url + "/", None, {})
    check(post.status == 405, "POST / answers 405, not %d" % post.status)
    api = call("GET", server.url + "/v1/conversations")
    check(api.status == 401, "the API still needs a token")


def a_wrong_token_gets_a_clear_message():
    page = Page()
    sign_in(page, "not-a-token-of-this-server")
    page.wait_visible("#login-error")
    text = page.eval("#login-error", "(e) => e.textContent")
    check(re.search(r"not one of this server's callers", text) and "401" in text,
          "the message says the token is refused: " + text)
    check(page.eval("#app", "(e) => e.hidden"), "nothing of the app is shown")
    check(page.js("return sessionStorage.getItem('berth.token')") is None,
          "the wrong token is not kept")
    page.shot("wrong-token-1280.png")
    page.set_viewport(360, 640)
    page.shot("wrong-token-360.png")
    page.close()


first_conv = None


def a_message_shows_the_card_with_the_cells_real_stdout():
    global first_conv
    page = Page()
    sign_in(page, tokens[0])
    page.wait_visible("#app")
    first_conv = new_conversation_by_keyboard(page)
    check(re.fullmatch(r"[0-9a-f]{32}", first_conv or ""), "a conversation id: %r" % first_conv)
    send_by_keyboard(page, 'print(6 * 7); import sys; print("to stderr", file=sys.stderr)')
    page.wait_visible("#log .card .stdout pre")
    wait_turn_ends(page, 1)
    card = page.eval("#log .card", """(c) => ({
        stdout: c.querySelector('.stdout pre').textContent,
        stderr: c.querySelector('.stderr pre').textContent,
        code: c.querySelector('.code').textContent,
        state: c.querySelector('.state').textContent,
        facts: c.querySelector('.facts').textContent,
        ok: c.classList.contains('ok'),
    })""")
    check(card["stdout"] == "42\n", "the cell's real stdout: %r" % card["stdout"])
    check(card["stderr"] == "to stderr\n", "its stderr: %r" % card["stderr"])
    check("print(6 * 7)" in card["code"], "the code is shown")
    check(card["ok"] and card["state"] == "exit 0", "exit 0 in success colours")
    check(re.search(r"freshSandboxyes", card["facts"]), "the first cell reports freshSandbox")
    check(re.search(r"interpreterStartedyes", card["facts"]), "and a fresh interpreter")
    check(re.search(r"isolation(container|kernel|process|vm)", card["facts"]),
          "the isolation tier")
    check(re.search(r"run record✓ verified [0-9a-f]{64}", card["facts"]),
          "the record digest, verified")
    said = page.eval_all("#log .assistant .text", "(v) => v.map((e) => e.textContent)")
    check("Running your code." in said and "Done." in said, "the assistant's text: %r" % said)
    # Follow the call, with the keyboard: the hops and their times.
    page.focus("#log .card .follow")
    page.keys(Keys.ENTER)
    page.wait_visible("#log .card .hop")
    hops = page.eval_all("#log .card .hop", """(v) => v.map((h) => ({
        name: h.querySelector('.hop-name').textContent,
        ms: h.querySelector('.hop-ms').textContent}))""")
    check(len(hops) == 7, "seven hops: %r" % hops)
    for name in ["model", "hook", "executeCode", "daemon → sandbox", "client checks"]:
        h = next((x for x in hops if x["name"] == name), None)
        check(h and re.fullmatch(r"[0-9.]+ ms", h["ms"]), "a time for the hop %s: %r" % (name, h))
    page.wait("document.querySelectorAll('#log .hop.lit').length === 7", what="7 lit hops")
    page.shot("conversation-1280.png")
    page.set_viewport(360, 800)
    page.shot("conversation-360.png")
    wide = page.js("return document.documentElement.scrollWidth")
    check(wide <= 360, "nothing overflows 360 px (scrollWidth %d)" % wide)
    problems = page.problems()
    check(not problems, "; ".join(problems))
    page.close()


def a_cell_that_raises_shows_exit_1_and_its_traceback():
    page = Page()
    sign_in(page, tokens[0])
    page.wait_visible("#app")
    new_conversation_by_keyboard(page)
    send_by_keyboard(page, 'raise ValueError("boom")')
    wait_turn_ends(page, 1)
    card = page.eval("#log .card", """(c) => ({
        bad: c.classList.contains('bad'), state: c.querySelector('.state').textContent,
        stateBad: c.querySelector('.state').classList.contains('bad'),
        stderr: c.querySelector('.stderr pre').textContent,
        color: getComputedStyle(c.querySelector('.stderr pre')).color,
    })""")
    check(card["bad"] and card["stateBad"] and card["state"] == "exit 1",
          "exit 1 in error colours: %r" % card)
    check(re.search(r"ValueError: boom", card["stderr"]), "the traceback: " + card["stderr"])
    r, g, b = [int(x) for x in re.findall(r"\d+", card["color"])[:3]]
    check(r > 120 and r > 2 * g and r > 2 * b, "stderr is red: " + card["color"])
    page.close()


def reload_mid_turn_resumes_the_stream_and_the_turn_finishes():
    page = Page()
    sign_in(page, tokens[0])
    page.wait_visible("#app")
    conv = new_conversation_by_keyboard(page)
    send_by_keyboard(page,
                     'import time; print("before", flush=True); time.sleep(3); print("after")')
    page.wait("document.querySelector('#log .card')", what="the tool call's card (mid-turn)")
    seen = page.js("return JSON.parse(sessionStorage.getItem('berth.turn'))")
    check(seen and seen["conv"] == conv and len(seen["events"]) > 0, "the running turn is kept")
    last = seen["events"][-1]["id"]
    busy = call("GET", server.url + "/v1/conversations/" + conv, tokens[0])
    check(busy.json and busy.json.get("busy") is True, "the turn still runs when the page reloads")
    page.reload()
    page.wait("/Resuming the running turn after event/.test("
              "document.getElementById('log').textContent)", what="the resuming note")
    note = page.eval("#log", "(l) => l.textContent")
    check(("after event %s" % last) in note, "resumed after the last event seen (%s)" % last)
    wait_turn_ends(page, 1)
    out = page.eval("#log .card .stdout pre", "(p) => p.textContent")
    check(out == "before\nafter\n", "the card of the resumed turn: %r" % out)
    check(page.eval_all("#log .card", "(v) => v.length") == 1, "one card, not two")
    check(turn_ends(page) == 1, "one turn end")
    check(page.js("return sessionStorage.getItem('berth.turn')") is None,
          "the finished turn is forgotten")
    check(page.eval("#send", "(b) => !b.disabled"), "the message box is usable again")
    problems = page.problems()
    check(not problems, "; ".join(problems))
    page.close()


def a_suspended_conversation_says_its_next_message_gets_a_fresh_sandbox():
    check(first_conv, "the first test opened a conversation")
    # --idle-timeout 1: the conversation of the first test suspends on its own.
    deadline = time.monotonic() + WAIT
    while True:
        info = call("GET", server.url + "/v1/conversations/" + first_conv, tokens[0])
        if (info.json and info.json.get("suspended")) or time.monotonic() > deadline:
            break
        time.sleep(0.1)   # polling the server's state
    check(info.json and info.json.get("suspended"), "the conversation suspended")
    page = Page()
    page.goto(server.url + "/")
    page.js("sessionStorage.setItem('berth.token', arguments[0]);"
            "sessionStorage.setItem('berth.conv', arguments[1]);", tokens[0], first_conv)
    page.reload()
    page.wait_visible("#conv-banner")
    text = page.eval("#conv-banner", "(b) => b.textContent")
    check(re.search(r"suspended", text) and re.search(r"fresh sandbox", text),
          "the banner: " + text)
    # The history of the first test is there, as stored.
    page.wait("document.querySelectorAll('#log .card').length === 1", what="the stored card")
    hist = page.eval("#log .card .stdout pre", "(p) => p.textContent")
    check(hist == "42\n", "the stored history shows the first cell: %r" % hist)
    page.focus("#composer-text")
    send_by_keyboard(page, 'print("again")')
    page.wait("document.querySelectorAll('#log .card').length === 2 &&"
              " document.querySelectorAll('#log .card')[1].querySelector('.stdout pre')"
              ".textContent", what="the second card's stdout")
    facts = page.eval_all("#log .card", "(v) => v[1].querySelector('.facts').textContent")
    check(re.search(r"freshSandboxyes", facts), "the next cell has a fresh sandbox: " + facts)
    page.shot("suspended-1280.png")
    page.close()


def a_second_caller_sees_none_of_the_first_callers_conversations():
    first = call("GET", server.url + "/v1/conversations", tokens[0])
    check(first.json and len(first.json["conversations"]) >= 3,
          "the first caller has its conversations")
    page = Page()   # a tab of its own: its own sessionStorage, where the page keeps all it keeps
    sign_in(page, tokens[1])
    page.wait_visible("#app")
    page.wait("/No conversations yet/.test(document.getElementById('convs-note').textContent)",
              what="'No conversations yet'")
    check(page.eval_all(".conv-item", "(v) => v.length") == 0, "an empty list")
    # Not even by its id: the page says it does not exist for this token.
    page.js("sessionStorage.setItem('berth.conv', arguments[0])", first_conv)
    page.reload()
    page.wait_visible("#conv-banner")
    text = page.eval("#conv-banner", "(b) => b.textContent")
    check(re.search(r"does not exist for this token", text), "another caller's id: " + text)
    check(page.eval_all("#log .card", "(v) => v.length") == 0, "none of its cards")
    page.close()
    page1 = Page()
    sign_in(page1, tokens[0])
    page1.wait("document.querySelectorAll('.conv-item').length === arguments[0]",
               len(first.json["conversations"]), what="the first caller's list")
    page1.set_viewport(1280, 900)
    page1.shot("list-1280.png")
    page1.close()


TESTS = [page_is_served_with_types_etag_and_a_strict_csp,
         a_wrong_token_gets_a_clear_message,
         a_message_shows_the_card_with_the_cells_real_stdout,
         a_cell_that_raises_shows_exit_1_and_its_traceback,
         reload_mid_turn_resumes_the_stream_and_the_turn_finishes,
         a_suspended_conversation_says_its_next_message_gets_a_fresh_sandbox,
         a_second_caller_sees_none_of_the_first_callers_conversations]

# }======================================================


def main():
    global work, server, driver
    # TEST_FILTER, as in the C suites and tests/lib/shtest.sh: a glob over test_NAME.
    pattern = os.environ.get("TEST_FILTER", "")
    passed, failed = 0, []
    work = tempfile.mkdtemp(prefix="berth-browser-")
    try:
        server = Server()
        driver = start_browser()
    except Exception as e:
        print("[  FAILED  ] setup: %s" % e)
        print("[  FAILED  ] 1 test(s), listed below:\n[  FAILED  ] setup")
        if server:
            server.child.kill()
        return 1
    for fn in TESTS:
        name = fn.__name__
        if pattern and not fnmatch.fnmatchcase("test_" + name, pattern):
            continue
        print("[ RUN      ] " + name, flush=True)
        t0 = time.monotonic()
        try:
            fn()
            print("[       OK ] %s (%d ms)" % (name, (time.monotonic() - t0) * 1000), flush=True)
            passed += 1
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)
            line = next((f.lineno for f in reversed(where) if f.name == name), 0)
            print("    %s (test_page.py:%d)" % (str(e).splitlines()[0] if str(e) else
                                                 type(e).__name__, line))
            print("[  FAILED  ] " + name, flush=True)
            failed.append(name)
            # A failure may leave a tab open: start the next test from the first one.
            for h in driver.window_handles[1:]:
                driver.switch_to.window(h)
                driver.close()
            driver.switch_to.window(driver.window_handles[0])
    driver.quit()
    server.child.send_signal(signal.SIGTERM)
    try:
        status = server.child.wait(timeout=WAIT)
    except subprocess.TimeoutExpired:
        server.child.kill()
        status = "not exited in %d s" % WAIT
    if failed or status != 0:
        print("serve log:\n" + log_tail())
    if status != 0:
        failed.append("serve_exits_0_on_SIGTERM(%s)" % status)
    shutil.rmtree(work, ignore_errors=True)
    print("[  PASSED  ] %d test(s)." % passed)
    if failed:
        print("[  FAILED  ] %d test(s), listed below:" % len(failed))
        for f in failed:
            print("[  FAILED  ] " + f)
        return 1
    print("screenshots: " + SHOTS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
