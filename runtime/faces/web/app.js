/*
 * app.js — the page of `berth serve`: sign in with a token, the caller's
 * conversations, a conversation's history, a message box, the assistant's text as it
 * streams, each tool call as a card, and "follow this call": the hops of one call with
 * the time spent in each.  Plain JavaScript, no framework, no build step.
 *
 * The event streams are read with fetch and a ReadableStream (EventSource cannot send
 * an Authorization header).  While a turn runs, its events are kept in sessionStorage
 * so that a reload shows them again and resumes the stream where it stopped
 * (GET /v1/conversations/{id}/events with Last-Event-ID).  Nothing from the server is
 * ever put in the page as HTML: every text goes through textContent.
 */
'use strict';

const TOKEN_KEY = 'berth.token';
const TURN_KEY = 'berth.turn';   /* the running turn: {conv, user, events: [...]} */
const CONV_KEY = 'berth.conv';   /* the open conversation */

/* Refusal names of the client: the call was not dispatched, nothing ran. */
const NOT_DISPATCHED = new Set(['request', 'permission', 'protocol', 'unsupported',
  'isolation', 'capacity', 'environment']);

const $ = (id) => document.getElementById(id);

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  listApi: true,          /* false once GET /v1/conversations answered "no such route" */
  eventsApi: true,        /* the same for …/events */
  convs: [],              /* [{id, status, turns, updatedAt, …}] newest first */
  cursor: null,
  current: null,          /* the open conversation's id */
  busy: false,            /* a turn of it streams into the page */
  cards: new Map(),       /* tool call id -> card */
  assistant: null,        /* the log item the deltas go to */
  turnStartedAt: 0,
};

/* {====================================================== small things */

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls)
    e.className = cls;
  if (text !== undefined && text !== null)
    e.textContent = String(text);
  return e;
}

function short(id) {
  return id ? id.slice(0, 8) : '';
}

function when(ms) {
  if (!ms)
    return '';
  const d = new Date(ms);
  return d.toLocaleString([], {dateStyle: 'short', timeStyle: 'short'});
}

function ms(v) {
  if (typeof v !== 'number' || !isFinite(v))
    return '—';
  return v < 10 ? v.toFixed(1) + ' ms' : Math.round(v) + ' ms';
}

function setNote(id, text, cls) {
  const n = $(id);
  n.textContent = text || '';
  n.className = 'note' + (cls ? ' ' + cls : '');
}

function loadTurn() {
  try {
    return JSON.parse(sessionStorage.getItem(TURN_KEY) || 'null');
  } catch (e) {
    return null;
  }
}

function saveTurn(t) {
  if (t)
    sessionStorage.setItem(TURN_KEY, JSON.stringify(t));
  else
    sessionStorage.removeItem(TURN_KEY);
}

/* }====================================================== */

/* {====================================================== the API */

class HttpError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(extra) {
  const h = Object.assign({Accept: 'application/json'}, extra || {});
  if (state.token)
    h.Authorization = 'Bearer ' + state.token;
  return h;
}

async function failure(res) {
  let code = 'http_' + res.status, message = res.statusText || 'request failed';
  try {
    const j = await res.json();
    if (j && j.error) {
      code = j.error.code || code;
      message = j.error.message || message;
    }
  } catch (e) { /* not JSON */ }
  if (res.status === 401)
    signOut('This token is not one of this server\'s callers (401 unauthenticated). ' +
            'Check it and paste it again.');
  return new HttpError(res.status, code, message);
}

async function api(method, path, body) {
  const init = {method, headers: headers(body ? {'Content-Type': 'application/json'} : null),
    cache: 'no-store'};
  if (body)
    init.body = JSON.stringify(body);
  const res = await fetch(path, init);
  if (!res.ok)
    throw await failure(res);
  return res.json();
}

/* A route this server does not have (an older berth serve): 404 "no such route". */
function noRoute(err) {
  return err instanceof HttpError && err.status === 404 && /route/.test(err.message);
}

/* Reads a text/event-stream body, calling onEvent({id, event, data}) per event. */
async function readEvents(res, onEvent) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done)
      break;
    buf += decoder.decode(value, {stream: true});
    buf = buf.replace(/\r\n?/g, '\n');
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const ev = {id: null, event: 'message', data: ''};
      const data = [];
      for (const line of block.split('\n')) {
        if (!line || line[0] === ':')
          continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let v = colon < 0 ? '' : line.slice(colon + 1);
        if (v[0] === ' ')
          v = v.slice(1);
        if (field === 'id')
          ev.id = v;
        else if (field === 'event')
          ev.event = v;
        else if (field === 'data')
          data.push(v);
      }
      try {
        ev.data = JSON.parse(data.join('\n'));
      } catch (e) {
        ev.data = data.join('\n');
      }
      onEvent(ev);
    }
  }
}

/* }====================================================== */

/* {====================================================== signing in */

function signOut(why) {
  state.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  $('app').hidden = true;
  $('forget').hidden = true;
  $('login').hidden = false;
  const e = $('login-error');
  e.textContent = why || '';
  e.hidden = !why;
  $('token').value = '';
  $('token').focus();
}

async function signIn(token) {
  state.token = token;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('login').hidden = true;
  $('login-error').hidden = true;
  $('app').hidden = false;
  $('forget').hidden = false;
  await refreshList(true);
  if (!state.token)
    return;                   /* refused: signOut said why */
  const turn = loadTurn();
  const open = (turn && turn.conv) || sessionStorage.getItem(CONV_KEY);
  if (open)
    await openConv(open, turn && turn.conv === open ? turn : null);
}

/* }====================================================== */

/* {====================================================== the list */

async function refreshList(reset) {
  if (reset) {
    state.convs = [];
    state.cursor = null;
  }
  try {
    let path = '/v1/conversations?limit=50';
    if (state.cursor)
      path += '&cursor=' + encodeURIComponent(state.cursor);
    const page = await api('GET', path);
    state.listApi = true;
    state.convs = state.convs.concat(page.conversations || []);
    state.cursor = page.nextCursor || null;
    setNote('convs-note', state.convs.length ? '' : 'No conversations yet.');
  } catch (err) {
    if (noRoute(err)) {
      state.listApi = false;
      setNote('convs-note', 'This server has no list of conversations (GET ' +
              '/v1/conversations answers 404): only the ones opened in this tab are shown.',
              'warn');
      await checkToken();
    } else if (state.token) {
      setNote('convs-note', 'Cannot list conversations: ' + err.message, 'bad');
    }
  }
  renderList();
}

/* Without the list API, a token is checked with a lookup of an id nobody has. */
async function checkToken() {
  try {
    await api('GET', '/v1/conversations/' + '0'.repeat(32));
  } catch (err) { /* 404 is the expected answer; 401 signs out */ }
}

function renderList() {
  const list = $('conv-list');
  list.replaceChildren();
  for (const c of state.convs) {
    const li = el('li');
    const b = el('button', 'conv-item');
    b.type = 'button';
    b.dataset.id = c.id;
    if (c.id === state.current)
      b.setAttribute('aria-current', 'true');
    b.append(el('span', 'conv-name', (c.metadata && c.metadata.title) || c.userId ||
                'Conversation ' + short(c.id)));
    const meta = el('span', 'conv-sub');
    meta.append(el('span', 'badge status-' + (c.status || 'open'), c.status || 'open'),
                ' ' + (c.turns || 0) + ' turn' + (c.turns === 1 ? '' : 's') +
                (c.updatedAt ? ' · ' + when(c.updatedAt) : ''));
    b.append(meta);
    b.addEventListener('click', () => openConv(c.id));
    li.append(b);
    list.append(li);
  }
  $('more-convs').hidden = !state.cursor;
}

function remember(id) {
  if (state.convs.some((c) => c.id === id))
    return;
  state.convs.unshift({id, status: 'open', turns: 0, updatedAt: Date.now()});
  setNote('convs-note', '');
  renderList();
}

async function newConv() {
  try {
    const r = await api('POST', '/v1/conversations', {});
    remember(r.id);
    await openConv(r.id);
    $('composer-text').focus();
  } catch (err) {
    if (state.token)
      setNote('convs-note', 'Cannot open a conversation: ' + err.message,
              err.status === 429 ? 'bad' : 'bad');
  }
}

/* }====================================================== */

/* {====================================================== a conversation */

function logItem(cls, who, text) {
  const li = el('li', 'msg ' + cls);
  if (who)
    li.append(el('span', 'who', who));
  const body = el('div', 'text', text);
  li.append(body);
  $('log').append(li);
  li.scrollIntoView({block: 'end'});
  return li;
}

function banner(text, cls) {
  const b = $('conv-banner');
  b.textContent = text || '';
  b.className = 'alert ' + (cls || 'info');
  b.hidden = !text;
}

function setBusy(busy) {
  state.busy = busy;
  $('composer-text').disabled = busy || !state.current;
  $('send').disabled = busy || !state.current;
  $('send').textContent = busy ? 'Running…' : 'Send';
}

async function openConv(id, turn) {
  state.current = id;
  state.cards = new Map();
  state.assistant = null;
  sessionStorage.setItem(CONV_KEY, id);
  document.body.classList.add('viewing');
  $('log').replaceChildren();
  banner('');
  $('conv-title').textContent = 'Conversation ' + short(id);
  $('conv-meta').textContent = '';
  renderList();
  setBusy(false);
  let info = null;
  try {
    info = await api('GET', '/v1/conversations/' + id);
  } catch (err) {
    if (!state.token)
      return;
    if (err.status === 404) {
      banner('This conversation does not exist for this token (it was completed, or it ' +
             'belongs to another caller).', 'error');
      sessionStorage.removeItem(CONV_KEY);
      if (turn)
        saveTurn(null);
      setBusy(true);
      return;
    }
    banner('Cannot read the conversation: ' + err.message, 'error');
  }
  if (info) {
    $('conv-meta').textContent = info.turns + ' turn' + (info.turns === 1 ? '' : 's') +
      (info.busy ? ' · a turn is running' : '') + ' · ' + (info.status || 'open');
    if (info.suspended)
      banner('This conversation is suspended: its sandbox was closed. The next message ' +
             'gets a fresh sandbox (the model is told freshSandbox and rebuilds).', 'info');
  }
  await showHistory(id);
  if (turn && turn.conv === id) {
    replayTurn(turn);
    await resume(id, turn);
  }
  if (!state.busy)
    $('composer-text').focus();
}

/* The stored history: ctx.messages (system, user, assistant with tool_calls, tool). */
async function showHistory(id) {
  let h;
  try {
    h = await api('GET', '/v1/conversations/' + id + '/messages');
  } catch (err) {
    if (noRoute(err))
      logItem('system', null, 'This server keeps no history to show (GET …/messages ' +
              'answers 404); new messages appear below.');
    else if (state.token)
      logItem('system error', null, 'Cannot read the history: ' + err.message);
    return;
  }
  const results = new Map();
  for (const m of h.messages || [])
    if (m && m.role === 'tool')
      results.set(m.tool_call_id, m.content);
  for (const m of h.messages || []) {
    if (!m || m.role === 'system' || m.role === 'tool')
      continue;
    if (m.role === 'user') {
      logItem('user', 'You', typeof m.content === 'string' ? m.content : JSON.stringify(m.content));
    } else if (m.role === 'assistant') {
      if (m.content)
        logItem('assistant', 'Assistant', m.content);
      for (const call of m.tool_calls || []) {
        const fn = call.function || {};
        const card = addCard(call.id, fn.name, fn.arguments);
        let r = results.get(call.id);
        try {
          r = typeof r === 'string' ? JSON.parse(r) : r;
        } catch (e) { /* kept as text */ }
        if (r && typeof r === 'object' && r.error !== undefined && r.exitCode === undefined)
          fillError(card, {code: r.code || 'error', message: String(r.error)});
        else if (r && typeof r === 'object')
          fillResult(card, r, null);
        else
          setCardState(card, 'no result', 'muted');
      }
    }
  }
}

/* Events of the running turn seen before a reload, shown again. */
function replayTurn(turn) {
  if (turn.user)
    logItem('user', 'You', turn.user);
  for (const ev of turn.events)
    onEvent(ev, true);
}

/* }====================================================== */

/* {====================================================== events */

function onEvent(ev, replaying) {
  const d = ev.data || {};
  switch (ev.event) {
    case 'delta':
      if (!state.assistant)
        state.assistant = logItem('assistant streaming', 'Assistant', '');
      state.assistant.querySelector('.text').textContent += d.text || '';
      break;
    case 'message':
      if (!state.assistant)
        state.assistant = logItem('assistant', 'Assistant', '');
      state.assistant.querySelector('.text').textContent = d.text || '';
      state.assistant.classList.remove('streaming');
      state.assistant = null;
      break;
    case 'tool_call': {
      state.assistant = null;
      const card = addCard(d.id, d.name, d.arguments);
      card.timing = Object.assign({}, d.timing || {});
      break;
    }
    case 'tool_result': {
      let card = state.cards.get(d.id);
      if (!card)
        card = addCard(d.id, 'executeCode', null);
      const timing = Object.assign({}, card.timing || {}, d.timing || {});
      card.timing = timing;
      if (d.error)
        fillError(card, d.error);
      else
        fillResult(card, d.result || {}, timing, d.noCodeRan);
      renderHops(card);
      break;
    }
    case 'error':
      state.assistant = null;
      showError(d);
      break;
    case 'turn_end': {
      state.assistant = null;
      const li = logItem('turn-end ' + (d.ok ? 'ok' : 'bad'), null,
                         'Turn ' + d.turn + (d.ok ? ' done' : ' failed') + ' in ' +
                         (typeof d.seconds === 'number' ? d.seconds.toFixed(2) : '?') + ' s · ' +
                         (d.cells || 0) + ' cell' + (d.cells === 1 ? '' : 's'));
      li.dataset.turn = d.turn;
      $('conv-meta').textContent = d.turn + ' turn' + (d.turn === 1 ? '' : 's') + ' · open';
      if (!replaying) {
        const c = state.convs.find((x) => x.id === state.current);
        if (c) {
          c.turns = d.turn;
          c.updatedAt = Date.now();
          c.status = 'open';
          state.convs = [c].concat(state.convs.filter((x) => x !== c));
          renderList();
        }
      }
      break;
    }
    default:
      break;
  }
}

function showError(d) {
  const li = logItem('system error', 'Error · ' + (d.code || 'error'), describeError(d));
  li.setAttribute('role', 'alert');
}

/* What an error code means to the person reading. */
function describeError(e) {
  const code = e.code || 'error', msg = e.message || '';
  if (code === 'data_loss')
    return 'Data loss: the answer could not be checked, so the call may have run and its ' +
           'result is not believed. Evidence: ' + msg;
  if (code === 'capacity')
    return 'Capacity: nothing ran (not dispatched); the daemon or this server is full. ' + msg;
  if (NOT_DISPATCHED.has(code))
    return 'Not dispatched (' + code + '): nothing ran. ' + msg;
  return msg;
}

/* }====================================================== */

/* {====================================================== tool call cards */

function parseArgs(text) {
  if (!text)
    return {};
  try {
    const a = JSON.parse(text);
    return a && typeof a === 'object' ? a : {code: String(text)};
  } catch (e) {
    return {code: String(text), unparsed: true};
  }
}

function addCard(id, name, argsText) {
  let card = state.cards.get(id);
  if (card)
    return card;
  card = $('card-template').content.firstElementChild.cloneNode(true);
  card.dataset.call = id || '';
  const args = parseArgs(argsText);
  card.querySelector('.card-title').textContent = (name || 'tool') + ' · ' + (id || '');
  card.querySelector('.lang').textContent = args.language || 'python';
  card.querySelector('.code code').textContent = args.code || '';
  const files = Array.isArray(args.files) ? args.files : [];
  if (files.length) {
    const ul = card.querySelector('.files ul');
    for (const f of files) {
      const content = f && typeof f.content === 'string' ? f.content : '';
      ul.append(el('li', null, (f && f.path) + ' (' + content.length + ' characters)'));
    }
    card.querySelector('.files').hidden = false;
  }
  const follow = card.querySelector('.follow');
  follow.addEventListener('click', () => toggleHops(card));
  state.cards.set(id, card);
  $('log').append(card);
  card.scrollIntoView({block: 'end'});
  return card;
}

function setCardState(card, text, cls) {
  const s = card.querySelector('.state');
  s.textContent = text;
  s.className = 'badge state ' + (cls || '');
}

function fact(dl, name, value, cls) {
  dl.append(el('dt', null, name));
  const dd = el('dd', cls, value);
  dl.append(dd);
  return dd;
}

function fillResult(card, r, timing, noCodeRan) {
  const ok = r.exitCode === 0 && !r.timedOut;
  card.classList.add(ok ? 'ok' : 'bad');
  setCardState(card, noCodeRan ? 'no code ran' : r.timedOut ? 'timed out' : 'exit ' + r.exitCode,
               noCodeRan ? 'warn' : ok ? 'good' : 'bad');
  if (r.language)
    card.querySelector('.lang').textContent = r.language;
  const dl = card.querySelector('.facts');
  dl.replaceChildren();
  if (noCodeRan)
    fact(dl, 'no code ran', 'the echo provider echoed the code back as its output', 'warn');
  fact(dl, 'exit code', String(r.exitCode), ok ? 'good' : 'bad');
  if (r.timedOut)
    fact(dl, 'timed out', 'yes', 'bad');
  fact(dl, 'interpreterStarted', r.freshInterpreter ? 'yes (freshInterpreter)' : 'no',
       r.freshInterpreter ? 'warn' : '');
  fact(dl, 'freshSandbox', r.freshSandbox ? 'yes' : 'no', r.freshSandbox ? 'warn' : '');
  fact(dl, 'stateKept', r.stateKept ? 'yes' : 'no');
  fact(dl, 'isolation', r.isolation || '—');
  if (r.recordSha256) {
    const dd = fact(dl, 'run record', '', 'good record');
    dd.append(el('span', 'verified', '✓ verified'), ' ',
              el('code', 'digest', r.recordSha256));
    dd.title = 'The client checked this run record\'s digest and chain before the result ' +
               'was believed';
  }
  if (r.truncated)
    fact(dl, 'truncated', 'yes', 'warn');
  const out = (cls, text) => {
    const box = card.querySelector('.' + cls);
    box.querySelector('pre').textContent = text || '';
    box.hidden = !text;
  };
  out('stdout', r.stdout);
  out('stderr', r.stderr);
  card.querySelector('.result').hidden = false;
  if (timing)
    card.timing = timing;
}

function fillError(card, e) {
  card.classList.add('bad');
  const code = e.code || 'error';
  setCardState(card, NOT_DISPATCHED.has(code) ? 'not dispatched' : code, 'bad');
  const f = card.querySelector('.failure');
  f.replaceChildren(el('strong', null, code), ' ', describeError(e));
  f.hidden = false;
  f.setAttribute('role', 'alert');
}

/* }====================================================== */

/* {====================================================== follow one call */

/* The hops of one call, in the order a call travels them, with the timing fields of
 * its tool events (runtime/README.md, "Timing of a tool call"). */
function hopsOf(t) {
  return [
    {name: 'model', what: 'the model step that asked for the call', ms: t.modelMs},
    {name: 'hook', what: 'onTurn, beforeToolCall and afterToolCall around the call',
     ms: t.hookMs},
    {name: 'executeCode', what: 'the native: waiting for the sandbox to open',
     ms: t.waitMs},
    {name: 'network', what: 'HTTP to the daemon and back', ms: t.networkMs},
    {name: 'daemon → sandbox', what: 'the daemon\'s wall time, the cell in the sandbox ' +
     'included', ms: t.daemonMs},
    {name: 'client checks', what: 'the answer\'s record digest and chain verified',
     ms: t.checkMs},
    {name: 'back to the model', what: 'the result in the next model step', ms: undefined},
  ];
}

function toggleHops(card) {
  const box = card.querySelector('.hops');
  const b = card.querySelector('.follow');
  const open = box.hidden;
  box.hidden = !open;
  b.setAttribute('aria-expanded', String(open));
  b.textContent = open ? 'Hide the hops' : 'Follow this call';
  if (open) {
    renderHops(card);
    light(card);
  }
}

function renderHops(card) {
  const box = card.querySelector('.hops');
  if (box.hidden)
    return;
  box.replaceChildren();
  const t = card.timing || {};
  if (!Object.keys(t).length) {
    box.append(el('p', 'note', 'No timing for this call: it comes from the live stream ' +
                  'only (a call shown from the stored history has none).'));
    return;
  }
  const hops = hopsOf(t);
  const max = Math.max(1, ...hops.map((h) => (typeof h.ms === 'number' ? h.ms : 0)));
  const ol = el('ol', 'hop-list');
  ol.setAttribute('aria-label', 'Hops of this call');
  for (const h of hops) {
    const li = el('li', 'hop');
    li.append(el('span', 'hop-name', h.name), el('span', 'hop-ms', ms(h.ms)));
    const bar = el('span', 'hop-bar');
    const fill = el('span', 'hop-fill');
    fill.style.width = (typeof h.ms === 'number' ? Math.max(2, 100 * h.ms / max) : 0) + '%';
    bar.append(fill);
    li.append(bar, el('span', 'hop-what', h.what));
    ol.append(li);
  }
  box.append(ol);
  if (typeof t.executeMs === 'number')
    box.append(el('p', 'note', 'executeCode in all: ' + ms(t.executeMs) +
                  (typeof t.callMs === 'number' ? ' · the call to the daemon, checks ' +
                   'included: ' + ms(t.callMs) : '')));
}

/* Lights each hop in turn, as the call travelled them. */
function light(card) {
  const hops = card.querySelectorAll('.hop');
  hops.forEach((h) => h.classList.remove('lit'));
  let i = 0;
  const step = () => {
    if (i < hops.length) {
      hops[i++].classList.add('lit');
      setTimeout(step, 180);
    }
  };
  step();
}

/* }====================================================== */

/* {====================================================== sending and resuming */

async function send(text) {
  const id = state.current;
  setBusy(true);
  banner('');
  logItem('user', 'You', text);
  const turn = {conv: id, user: text, events: []};
  saveTurn(turn);
  let res;
  try {
    res = await fetch('/v1/conversations/' + id + '/messages', {
      method: 'POST',
      headers: headers({'Content-Type': 'application/json', Accept: 'text/event-stream'}),
      body: JSON.stringify({content: text}), cache: 'no-store'});
  } catch (err) {
    saveTurn(null);
    logItem('system error', 'Error', 'The server could not be reached: ' + err.message);
    setBusy(false);
    return;
  }
  if (!res.ok) {
    saveTurn(null);
    const err = await failure(res);
    if (state.token)
      showError({code: err.code, message: err.message});
    setBusy(false);
    return;
  }
  await follow(res, turn);
}

/* Follows a turn's stream; keeps its events for a reload. */
async function follow(res, turn) {
  let ended = false;
  try {
    await readEvents(res, (ev) => {
      if (turn.conv !== state.current)
        return;
      turn.events.push(ev);
      saveTurn(turn);
      onEvent(ev, false);
      if (ev.event === 'turn_end')
        ended = true;
    });
  } catch (err) {
    if (turn.conv === state.current)
      logItem('system error', 'Error', 'The stream broke: ' + err.message +
              ' (reload the page to resume it)');
    return;
  }
  if (turn.conv !== state.current)
    return;
  if (ended) {
    saveTurn(null);
    setBusy(false);
    $('composer-text').focus();
  } else {
    logItem('system warn', null, 'The stream ended before the turn did; reload to resume.');
    setBusy(false);
  }
}

/* After a reload: the events after the last one seen (Last-Event-ID). */
async function resume(id, turn) {
  if (!state.eventsApi)
    return;
  const last = turn.events.length ? turn.events[turn.events.length - 1] : null;
  if (last && last.event === 'turn_end') {
    saveTurn(null);
    return;
  }
  setBusy(true);
  const h = headers({Accept: 'text/event-stream'});
  if (last && last.id)
    h['Last-Event-ID'] = last.id;
  const note = logItem('system', null, 'Resuming the running turn' +
                       (last && last.id ? ' after event ' + last.id : '') + '…');
  let res;
  try {
    res = await fetch('/v1/conversations/' + id + '/events', {headers: h, cache: 'no-store'});
  } catch (err) {
    note.querySelector('.text').textContent = 'Cannot resume: ' + err.message;
    setBusy(false);
    return;
  }
  if (!res.ok) {
    const err = await failure(res);
    if (noRoute(err)) {
      state.eventsApi = false;
      note.querySelector('.text').textContent = 'This server cannot resume a stream (no ' +
        '…/events route): open the conversation again once its turn has ended.';
    } else {
      note.querySelector('.text').textContent = 'Cannot resume: ' + err.message;
    }
    saveTurn(null);
    setBusy(false);
    return;
  }
  await follow(res, turn);
}

/* }====================================================== */

/* {====================================================== start */

function start() {
  $('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const t = $('token').value.trim();
    if (t)
      signIn(t);
  });
  $('forget').addEventListener('click', () => {
    saveTurn(null);
    sessionStorage.removeItem(CONV_KEY);
    signOut('');
  });
  $('new-conv').addEventListener('click', newConv);
  $('more-convs').addEventListener('click', () => refreshList(false));
  $('back').addEventListener('click', () => {
    document.body.classList.remove('viewing');
    const b = document.querySelector('.conv-item[aria-current="true"]') ||
              $('new-conv');
    b.focus();
  });
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const box = $('composer-text');
    const text = box.value.trim();
    if (!text || state.busy || !state.current)
      return;
    box.value = '';
    send(text);
  });
  $('composer-text').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  fetch('/healthz', {cache: 'no-store'}).then((r) => r.json()).then((j) => {
    setNote('server-note', 'server ' + (j.status || '?'), j.status === 'ok' ? 'good' : 'bad');
  }).catch(() => setNote('server-note', 'server unreachable', 'bad'));
  if (state.token)
    signIn(state.token);
  else
    signOut('');
}

start();
