/*
 * browser.test.js — the page of `berth serve` in a real browser: headless Chromium
 * (Debian's /usr/bin/chromium, driven by puppeteer-core, which never downloads one)
 * against a real `berth serve` that starts a real sandboxd (provider $BERTH_PROVIDER,
 * default bwrap) with the scripted model: each message is run as a Python cell.
 * Prints cmocka-style lines for tests/run.sh (tests/test_browser.sh runs it).
 *
 *   BUILD=build-x node tests/browser/browser.test.js [NAME_FILTER]
 *
 * Screenshots at 1280 and 360 px wide go to $BUILD/browser/.  Every wait ends on
 * something the page or the server shows (bounded by a timeout), never on a sleep.
 */
'use strict';

const {spawn} = require('child_process');
const crypto = require('crypto');
const fs = require('fs');
const os = require('os');
const path = require('path');
const readline = require('readline');
const puppeteer = require('puppeteer-core');

const ROOT = path.resolve(__dirname, '..', '..');
const BUILD = path.resolve(ROOT, process.env.BUILD || 'build');
const PROVIDER = process.env.BERTH_PROVIDER || 'bwrap';
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const SHOTS = path.join(BUILD, 'browser');
const WAIT = 20000;

/* Each message is a cell: the scripted model runs the user's text as Python. */
const SCRIPT = `return { template = true, loop = true, turns = {
  { user = "*", replies = { { say = "Running your code.", call = { code = "{{user}}" } },
                            { say = "Done." } } } } }
`;

let work, server, browser;
const tokens = [crypto.randomBytes(16).toString('hex'), crypto.randomBytes(16).toString('hex')];

function startServer() {
  work = fs.mkdtempSync(path.join(os.tmpdir(), 'berth-browser-'));
  fs.writeFileSync(path.join(work, 'tokens'), '# two callers\n' + tokens.join('\n') + '\n');
  fs.writeFileSync(path.join(work, 'model.lua'), SCRIPT);
  const args = ['serve', '--listen', '127.0.0.1:0', '--token-file', path.join(work, 'tokens'),
    '--model', 'scripted:' + path.join(work, 'model.lua'), '--state-dir', work,
    '--sandboxd', path.join(BUILD, 'sandboxd'), '--provider', PROVIDER,
    '--idle-timeout', '1'];
  const log = fs.openSync(path.join(work, 'serve.log'), 'w');
  const child = spawn(path.join(BUILD, 'berth'), args, {stdio: ['ignore', 'pipe', log]});
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('berth serve did not start')), WAIT);
    child.on('exit', (code) => reject(new Error('berth serve exited: ' + code + '\n' +
      fs.readFileSync(path.join(work, 'serve.log'), 'utf8'))));
    readline.createInterface({input: child.stdout}).on('line', (line) => {
      const m = /^listening (http:\/\/\S+)/.exec(line);
      if (m) {
        clearTimeout(timer);
        resolve({child, url: m[1]});
      }
    });
  });
}

async function call(method, url, token, body) {
  const h = {};
  if (token)
    h.Authorization = 'Bearer ' + token;
  if (body)
    h['Content-Type'] = 'application/json';
  const res = await fetch(url, {method, headers: h, body: body ? JSON.stringify(body) : undefined});
  const text = await res.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch (e) { /* not JSON */ }
  return {status: res.status, headers: res.headers, text, json};
}

function check(cond, what) {
  if (!cond)
    throw new Error('check failed: ' + what);
}

async function newPage(context, width) {
  const page = await (context || browser).newPage();
  await page.setViewport({width: width || 1280, height: 900});
  const problems = [];
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/401|404|Unauthorized|Not Found/.test(m.text()))
      problems.push('console error: ' + m.text());
  });
  page.problems = problems;
  return page;
}

async function signIn(page, token) {
  await page.goto(server.url + '/', {waitUntil: 'load'});
  await page.waitForSelector('#token', {visible: true, timeout: WAIT});
  /* The page puts the focus in the token field: type there, Enter submits. */
  await page.keyboard.type(token);
  await page.keyboard.press('Enter');
}

/* Keyboard only: Tab to "New conversation", Enter; the page focuses the message box. */
async function newConversationByKeyboard(page) {
  for (let i = 0; i < 12; i++) {
    await page.keyboard.press('Tab');
    const id = await page.evaluate(() => document.activeElement && document.activeElement.id);
    if (id === 'new-conv')
      break;
  }
  check(await page.evaluate(() => document.activeElement.id === 'new-conv'),
        '"New conversation" is reachable with Tab');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => document.activeElement &&
                             document.activeElement.id === 'composer-text' &&
                             !document.activeElement.disabled, {timeout: WAIT});
  return page.evaluate(() => sessionStorage.getItem('berth.conv'));
}

async function sendByKeyboard(page, text) {
  await page.keyboard.type(text);
  await page.keyboard.down('Control');
  await page.keyboard.press('Enter');
  await page.keyboard.up('Control');
}

/* The number of finished turns the log shows. */
function turnEnds(page) {
  return page.$$eval('#log .turn-end', (v) => v.length);
}

async function waitTurnEnds(page, n) {
  await page.waitForFunction((k) => document.querySelectorAll('#log .turn-end').length >= k,
                             {timeout: WAIT}, n);
}

async function shot(page, name) {
  fs.mkdirSync(SHOTS, {recursive: true});
  /* The whole page in one viewport, so that the sticky message box sits at its end. */
  const vp = page.viewport();
  const height = await page.evaluate(() => document.documentElement.scrollHeight);
  await page.setViewport({width: vp.width, height: Math.max(vp.height, height)});
  await page.screenshot({path: path.join(SHOTS, name)});
  await page.setViewport(vp);
}

/* {====================================================== the tests */

const tests = {};

tests.page_is_served_with_types_etag_and_a_strict_csp = async () => {
  const page = await call('GET', server.url + '/');
  check(page.status === 200, 'GET / answers 200, with no token');
  check(/^text\/html/.test(page.headers.get('content-type')), 'the page is text/html');
  const csp = page.headers.get('content-security-policy') || '';
  check(/default-src 'none'/.test(csp) && /script-src 'self'/.test(csp) &&
        !/unsafe-inline/.test(csp), 'a strict Content-Security-Policy: ' + csp);
  check(page.headers.get('x-content-type-options') === 'nosniff', 'nosniff');
  check(page.text.includes('/app.js') && !/<script>[^<]/.test(page.text), 'no inline script');
  const js = await call('GET', server.url + '/app.js');
  check(js.status === 200 && /^text\/javascript/.test(js.headers.get('content-type')), 'app.js');
  const css = await call('GET', server.url + '/style.css');
  check(css.status === 200 && /^text\/css/.test(css.headers.get('content-type')), 'style.css');
  const etag = css.headers.get('etag');
  const again = await fetch(server.url + '/style.css', {headers: {'If-None-Match': etag}});
  check(again.status === 304, 'If-None-Match with its ETag answers 304, not ' + again.status);
  const post = await call('POST', server.url + '/', null, {});
  check(post.status === 405, 'POST / answers 405, not ' + post.status);
  const api = await call('GET', server.url + '/v1/conversations');
  check(api.status === 401, 'the API still needs a token');
};

tests.a_wrong_token_gets_a_clear_message = async () => {
  const page = await newPage();
  await signIn(page, 'not-a-token-of-this-server');
  await page.waitForSelector('#login-error', {visible: true, timeout: WAIT});
  const text = await page.$eval('#login-error', (e) => e.textContent);
  check(/not one of this server's callers/.test(text) && /401/.test(text),
        'the message says the token is refused: ' + text);
  check(await page.$eval('#app', (e) => e.hidden), 'nothing of the app is shown');
  check(await page.evaluate(() => sessionStorage.getItem('berth.token')) === null,
        'the wrong token is not kept');
  await shot(page, 'wrong-token-1280.png');
  await page.setViewport({width: 360, height: 640});
  await shot(page, 'wrong-token-360.png');
  await page.close();
};

let firstConv = null;

tests.a_message_shows_the_card_with_the_cells_real_stdout = async () => {
  const page = await newPage();
  await signIn(page, tokens[0]);
  await page.waitForSelector('#app', {visible: true, timeout: WAIT});
  firstConv = await newConversationByKeyboard(page);
  check(/^[0-9a-f]{32}$/.test(firstConv || ''), 'a conversation id: ' + firstConv);
  await sendByKeyboard(page, 'print(6 * 7); import sys; print("to stderr", file=sys.stderr)');
  await page.waitForSelector('#log .card .stdout pre', {visible: true, timeout: WAIT});
  await waitTurnEnds(page, 1);
  const card = await page.$eval('#log .card', (c) => ({
    stdout: c.querySelector('.stdout pre').textContent,
    stderr: c.querySelector('.stderr pre').textContent,
    code: c.querySelector('.code').textContent,
    state: c.querySelector('.state').textContent,
    facts: c.querySelector('.facts').textContent,
    ok: c.classList.contains('ok'),
  }));
  check(card.stdout === '42\n', 'the cell\'s real stdout: ' + JSON.stringify(card.stdout));
  check(card.stderr === 'to stderr\n', 'its stderr: ' + JSON.stringify(card.stderr));
  check(card.code.includes('print(6 * 7)'), 'the code is shown');
  check(card.ok && card.state === 'exit 0', 'exit 0 in success colours');
  check(/freshSandboxyes/.test(card.facts), 'the first cell reports freshSandbox');
  check(/interpreterStartedyes/.test(card.facts), 'and a fresh interpreter');
  check(/isolation(container|kernel|process|vm)/.test(card.facts), 'the isolation tier');
  check(/run record✓ verified [0-9a-f]{64}/.test(card.facts), 'the record digest, verified');
  const said = await page.$$eval('#log .assistant .text', (v) => v.map((e) => e.textContent));
  check(said.includes('Running your code.') && said.includes('Done.'),
        'the assistant\'s text: ' + JSON.stringify(said));
  /* Follow the call, with the keyboard: the hops and their times. */
  await page.focus('#log .card .follow');
  await page.keyboard.press('Enter');
  await page.waitForSelector('#log .card .hop', {visible: true, timeout: WAIT});
  const hops = await page.$$eval('#log .card .hop', (v) => v.map((h) => ({
    name: h.querySelector('.hop-name').textContent, ms: h.querySelector('.hop-ms').textContent})));
  check(hops.length === 7, 'seven hops: ' + JSON.stringify(hops));
  for (const name of ['model', 'hook', 'executeCode', 'daemon → sandbox', 'client checks']) {
    const h = hops.find((x) => x.name === name);
    check(h && /^[0-9.]+ ms$/.test(h.ms), 'a time for the hop ' + name + ': ' +
          JSON.stringify(h));
  }
  await page.waitForFunction(() => document.querySelectorAll('#log .hop.lit').length === 7,
                             {timeout: WAIT});
  await shot(page, 'conversation-1280.png');
  await page.setViewport({width: 360, height: 800});
  await shot(page, 'conversation-360.png');
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  check(wide <= 360, 'nothing overflows 360 px (scrollWidth ' + wide + ')');
  check(page.problems.length === 0, page.problems.join('; '));
  await page.close();
};

tests.a_cell_that_raises_shows_exit_1_and_its_traceback = async () => {
  const page = await newPage();
  await signIn(page, tokens[0]);
  await page.waitForSelector('#app', {visible: true, timeout: WAIT});
  await newConversationByKeyboard(page);
  await sendByKeyboard(page, 'raise ValueError("boom")');
  await waitTurnEnds(page, 1);
  const card = await page.$eval('#log .card', (c) => ({
    bad: c.classList.contains('bad'), state: c.querySelector('.state').textContent,
    stateBad: c.querySelector('.state').classList.contains('bad'),
    stderr: c.querySelector('.stderr pre').textContent,
    color: getComputedStyle(c.querySelector('.stderr pre')).color,
  }));
  check(card.bad && card.stateBad && card.state === 'exit 1', 'exit 1 in error colours: ' +
        JSON.stringify(card));
  check(/ValueError: boom/.test(card.stderr), 'the traceback: ' + card.stderr);
  const [r, g, b] = card.color.match(/\d+/g).map(Number);
  check(r > 120 && r > 2 * g && r > 2 * b, 'stderr is red: ' + card.color);
  await page.close();
};

tests.reload_mid_turn_resumes_the_stream_and_the_turn_finishes = async () => {
  const page = await newPage();
  await signIn(page, tokens[0]);
  await page.waitForSelector('#app', {visible: true, timeout: WAIT});
  const id = await newConversationByKeyboard(page);
  await sendByKeyboard(page,
    'import time; print("before", flush=True); time.sleep(3); print("after")');
  await page.waitForSelector('#log .card', {timeout: WAIT});   /* the tool_call: mid-turn */
  const seen = await page.evaluate(() => JSON.parse(sessionStorage.getItem('berth.turn')));
  check(seen && seen.conv === id && seen.events.length > 0, 'the running turn is kept');
  const last = seen.events[seen.events.length - 1].id;
  const busy = await call('GET', server.url + '/v1/conversations/' + id, tokens[0]);
  check(busy.json && busy.json.busy === true, 'the turn still runs when the page reloads');
  await page.reload({waitUntil: 'load'});
  await page.waitForFunction(() => /Resuming the running turn after event/.test(
    document.getElementById('log').textContent), {timeout: WAIT});
  const note = await page.$eval('#log', (l) => l.textContent);
  check(note.includes('after event ' + last), 'resumed after the last event seen (' + last + ')');
  await waitTurnEnds(page, 1);
  const out = await page.$eval('#log .card .stdout pre', (p) => p.textContent);
  check(out === 'before\nafter\n', 'the card of the resumed turn: ' + JSON.stringify(out));
  check(await page.$$eval('#log .card', (v) => v.length) === 1, 'one card, not two');
  check(await turnEnds(page) === 1, 'one turn end');
  check(await page.evaluate(() => sessionStorage.getItem('berth.turn')) === null,
        'the finished turn is forgotten');
  check(await page.$eval('#send', (b) => !b.disabled), 'the message box is usable again');
  check(page.problems.length === 0, page.problems.join('; '));
  await page.close();
};

tests.a_suspended_conversation_says_its_next_message_gets_a_fresh_sandbox = async () => {
  check(firstConv, 'the first test opened a conversation');
  /* --idle-timeout 1: the conversation of the first test suspends on its own. */
  const deadline = Date.now() + WAIT;
  let info;
  do {
    info = await call('GET', server.url + '/v1/conversations/' + firstConv, tokens[0]);
    if (info.json && info.json.suspended)
      break;
    await new Promise((r) => setTimeout(r, 100));   /* polling the server's state */
  } while (Date.now() < deadline);
  check(info.json && info.json.suspended, 'the conversation suspended');
  const page = await newPage();
  await page.goto(server.url + '/', {waitUntil: 'load'});
  await page.evaluate((t, c) => {
    sessionStorage.setItem('berth.token', t);
    sessionStorage.setItem('berth.conv', c);
  }, tokens[0], firstConv);
  await page.reload({waitUntil: 'load'});
  await page.waitForSelector('#conv-banner', {visible: true, timeout: WAIT});
  const text = await page.$eval('#conv-banner', (b) => b.textContent);
  check(/suspended/.test(text) && /fresh sandbox/.test(text), 'the banner: ' + text);
  /* The history of the first test is there, as stored. */
  await page.waitForFunction(() => document.querySelectorAll('#log .card').length === 1,
                             {timeout: WAIT});
  const hist = await page.$eval('#log .card .stdout pre', (p) => p.textContent);
  check(hist === '42\n', 'the stored history shows the first cell: ' + JSON.stringify(hist));
  await page.focus('#composer-text');
  await sendByKeyboard(page, 'print("again")');
  await page.waitForFunction(() => document.querySelectorAll('#log .card').length === 2 &&
    document.querySelectorAll('#log .card')[1].querySelector('.stdout pre').textContent,
  {timeout: WAIT});
  const facts = await page.$$eval('#log .card', (v) => v[1].querySelector('.facts').textContent);
  check(/freshSandboxyes/.test(facts), 'the next cell has a fresh sandbox: ' + facts);
  await shot(page, 'suspended-1280.png');
  await page.close();
};

tests.a_second_caller_sees_none_of_the_first_callers_conversations = async () => {
  const first = await call('GET', server.url + '/v1/conversations', tokens[0]);
  check(first.json.conversations.length >= 3, 'the first caller has its conversations');
  const context = await browser.createBrowserContext();   /* its own sessionStorage */
  const page = await newPage(context);
  await signIn(page, tokens[1]);
  await page.waitForSelector('#app', {visible: true, timeout: WAIT});
  await page.waitForFunction(() => /No conversations yet/.test(
    document.getElementById('convs-note').textContent), {timeout: WAIT});
  check(await page.$$eval('.conv-item', (v) => v.length) === 0, 'an empty list');
  /* Not even by its id: the page says it does not exist for this token. */
  await page.evaluate((c) => sessionStorage.setItem('berth.conv', c), firstConv);
  await page.reload({waitUntil: 'load'});
  await page.waitForSelector('#conv-banner', {visible: true, timeout: WAIT});
  const text = await page.$eval('#conv-banner', (b) => b.textContent);
  check(/does not exist for this token/.test(text), 'another caller\'s id: ' + text);
  check(await page.$$eval('#log .card', (v) => v.length) === 0, 'none of its cards');
  const page1 = await newPage();
  await signIn(page1, tokens[0]);
  await page1.waitForFunction((n) => document.querySelectorAll('.conv-item').length === n,
                              {timeout: WAIT}, first.json.conversations.length);
  await page1.setViewport({width: 1280, height: 900});
  await shot(page1, 'list-1280.png');
  await page1.close();
  await context.close();
};

/* }====================================================== */

async function main() {
  const filter = process.argv[2] || process.env.TEST_FILTER || '';
  let passed = 0;
  const failed = [];
  try {
    server = await startServer();
    browser = await puppeteer.launch({
      executablePath: CHROMIUM, headless: true, userDataDir: path.join(work, 'chromium'),
      args: ['--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
        '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
    });
  } catch (e) {
    console.log('[  FAILED  ] setup: ' + e.message);
    console.log('[  FAILED  ] 1 test(s), listed below:\n[  FAILED  ] setup');
    if (server)
      server.child.kill('SIGKILL');
    process.exit(1);
  }
  for (const [name, fn] of Object.entries(tests)) {
    if (filter && !name.includes(filter))
      continue;
    console.log('[ RUN      ] ' + name);
    const t0 = Date.now();
    try {
      await fn();
      console.log('[       OK ] ' + name + ' (' + (Date.now() - t0) + ' ms)');
      passed++;
    } catch (e) {
      console.log('    ' + String(e.stack || e).split('\n').slice(0, 4).join('\n    '));
      console.log('[  FAILED  ] ' + name);
      failed.push(name);
    }
  }
  await browser.close();
  server.child.removeAllListeners('exit');
  const exited = new Promise((r) => server.child.on('exit', (code, sig) => r(code === null ? sig : code)));
  server.child.kill('SIGTERM');
  const status = await exited;
  if (failed.length || status !== 0)
    console.log('serve log:\n' + fs.readFileSync(path.join(work, 'serve.log'), 'utf8').slice(-3000));
  if (status !== 0)
    failed.push('serve_exits_0_on_SIGTERM(' + status + ')');
  fs.rmSync(work, {recursive: true, force: true});
  console.log('[  PASSED  ] ' + passed + ' test(s).');
  if (failed.length) {
    console.log('[  FAILED  ] ' + failed.length + ' test(s), listed below:');
    for (const f of failed)
      console.log('[  FAILED  ] ' + f);
    process.exit(1);
  }
  console.log('screenshots: ' + SHOTS);
}

main();
