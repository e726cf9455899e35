// kernel.js - sandboxd's persistent JavaScript interpreter (one per session sandbox).
//
// Started by the in-sandbox supervisor as `node --expose-internals -e <this> PREFIX TOKEN`
// with fd 0 /dev/null and fds 1 and 2 the cell's stdout and stderr (FIFOs the daemon
// reads; Node writes to them without blocking and queues what the pipe does not take).
// It reads requests from the FIFO PREFIX-req and writes replies to PREFIX-rep; a frame
// is a 4-byte little-endian length and a body:
//   request  nonce (32 ASCII hex) + code (UTF-8)
//   reply    "R" + TOKEN (ready, once)  |  "D" + status ("0" ran, "1" raised) + nonce
//            + spawned ("1" when the cell may have started a process, else "0")
// Before its "D" reply it writes the end mark 0x1f + nonce + 0x1e on fds 1 and 2, once
// everything the cell gave process.stdout and process.stderr has left Node's queue; the
// "D" frame goes right after fd 2's mark, in the same write (on PREFIX-rep when fd 2 is
// closed).
// Notebook semantics: cells run as scripts in this process's global context; top-level
// let/const/class become var so names can be declared again; top-level await works
// (Node's REPL transform); a final value that is not undefined is stored as
// globalThis._ and printed with util.inspect.  Errors end the cell, never the
// interpreter; uncaught errors between cells are printed, never fatal.
'use strict';
(() => {
  const fs = require('fs');
  const net = require('net');
  const path = require('path');
  const url = require('url');
  const util = require('util');
  const vm = require('vm');
  const Module = require('module');
  let acorn = null;
  let toplevelAwait = null;
  try { acorn = require('internal/deps/acorn/acorn/dist/acorn'); } catch (e) { /* plain */ }
  try { toplevelAwait = require('internal/repl/await').processTopLevelAwait; } catch (e) { /* plain */ }
  let rejectionPending = () => true;
  try { rejectionPending = require('internal/process/promises').hasRejectionToWarn; } catch (e) { /* wait */ }

  // The vm-modules flag makes Node warn on first use.  Newer Nodes could be told not to
  // with --disable-warning, which Debian 12's Node 18 refuses as a bad option; so the
  // kernel drops that one warning itself and lets every other warning through.
  const emitWarning = process.emitWarning;
  process.emitWarning = function (warning, ...rest) {
    const type = typeof rest[0] === 'string' ? rest[0] : rest[0] && rest[0].type;
    if (type === 'ExperimentalWarning' || (warning && warning.name === 'ExperimentalWarning')) return;
    return emitWarning.call(process, warning, ...rest);
  };

  const [prefix, token] = process.argv.slice(1);
  // Opened here, close-on-exec: nothing a cell starts inherits them.
  const reqFd = fs.openSync(prefix + '-req', fs.constants.O_RDONLY);
  const repFd = fs.openSync(prefix + '-rep', fs.constants.O_WRONLY);
  const work = process.cwd();
  // Whether a cell may have started a process: every child_process function ends in
  // ChildProcess.prototype.spawn or the internal spawnSync.  The daemon may skip its
  // sweep after a cell that started none (a cell that goes around this only keeps its
  // own leftovers, within the sandbox's limits).
  let spawned = false;
  let canTell = true;
  try {
    const internal = require('internal/child_process');
    const asyncSpawn = internal.ChildProcess.prototype.spawn;
    internal.ChildProcess.prototype.spawn = function (...a) { spawned = true; return asyncSpawn.apply(this, a); };
    const syncSpawn = internal.spawnSync;
    internal.spawnSync = function (...a) { spawned = true; return syncSpawn.apply(this, a); };
  } catch (e) { canTell = false; /* always say it may have */ }
  globalThis.require = Module.createRequire(path.join(work, '[cell]'));
  const inspectOptions = { depth: 4, maxArrayLength: 100, maxStringLength: 10000 };

  // A frame: a 4-byte little-endian length, then the body (latin1: bytes as they are).
  function frame(body) {
    const b = Buffer.from(body, 'latin1');
    const head = Buffer.alloc(4);
    head.writeUInt32LE(b.length, 0);
    return Buffer.concat([head, b]);
  }

  let warming = false; // the warm-up's cells go the whole way but answer nobody
  let warmLeft = 0; // of those sent through the request FIFO, the ones not yet done
  let warmDone = null;
  function send(body) {
    if (warming) return;
    const all = frame(body);
    let off = 0;
    while (off < all.length) off += fs.writeSync(repFd, all, off);
  }

  // The cell's own streams, as they were before any cell could replace them.
  const stdout = process.stdout;
  const stderr = process.stderr;

  // Resolves once what the cell wrote to `stream` has left Node's queue.  libuv made the
  // FIFO non-blocking: a write the pipe does not take at once (20 MiB) waits in the
  // stream, and an end mark written past it would let a later cell's answer carry it.
  // Writes complete in order, so the callback of an empty write comes after all of it.
  // A stream that is gone does not hold the kernel; one that never drains is ended by
  // the cell's deadline.
  function drained(stream) {
    return new Promise((resolve) => {
      try {
        while (stream.writableCorked) stream.uncork();
        if (stream.destroyed || !stream.writable || !stream.writableLength) return resolve();
        stream.write('', () => resolve());
      } catch (e) {
        resolve();
      }
    });
  }

  // The last expression's inspection, when it may go out with the stdout end mark in one
  // write, as kernel.py's does (under gVisor's ptrace platform a system call costs about
  // 0.1 ms): only while process.stdout is the kernel's own stream with nothing queued in
  // it, and with the mark under PIPE_BUF (whole, never interleaved).  Until then the
  // stream's first write -- a promise callback's console.log, a worker's output -- sends
  // it first, so what reaches the daemon comes in the order it did before.
  const MARK_LEN = 34;
  const PIPE_BUF = 4096;
  let tail = null;
  const stdoutWrite = stdout.write;
  function flushTail() {
    const t = tail;
    tail = null;
    stdoutWrite.call(stdout, t);
  }
  stdout.write = function write(...args) {
    if (tail !== null) flushTail();
    return stdoutWrite.apply(this, args);
  };
  function showValue(text) {
    if (process.stdout === stdout && !stdout.writableLength && !stdout.writableCorked &&
        stdout.writable && !stdout.destroyed) {
      const data = Buffer.from(text, 'utf8');
      if (data.length + MARK_LEN <= PIPE_BUF) {
        tail = data;
        return;
      }
    }
    process.stdout.write(text);
  }

  // The end mark on both streams, before the end reply: what a timer or a child writes
  // after it is output between cells, dropped by the daemon.  Shorter than PIPE_BUF, so
  // written whole and never interleaved.  A full pipe (a child still writing) is waited
  // for, never skipped: the daemon reads it all along.  With `reply`, the end reply goes
  // in the same write as stderr's mark (one system call less a cell), or on the reply
  // FIFO when stderr is closed.
  async function endMark(nonce, fds, reply) {
    const mark = Buffer.from('\x1f' + nonce + '\x1e', 'latin1');
    for (const fd of fds) {
      for (;;) {
        let data = mark;
        if (fd === 1 && tail !== null) data = Buffer.concat([tail, mark]);
        else if (fd === 2 && reply) data = Buffer.concat([mark, frame(reply)]);
        try {
          fs.writeSync(fd, data);
          if (fd === 1) tail = null;
          if (fd === 2 && reply) return;
          break;
        } catch (e) {
          if (e.code !== 'EAGAIN') { // closed by the cell: the daemon takes what is queued
            if (fd === 1 && tail !== null) { // the value was lost with it, as a write's
              tail = null;                    // would have been: said on stderr
              show(describe(e) + '\n');
            }
            break;
          }
          if (fd === 1 && tail !== null) { // the value goes the stream's way after all
            flushTail();
            await drained(stdout);
            continue;
          }
          await new Promise((resolve) => setTimeout(resolve, 1));
        }
      }
    }
    if (reply) send(reply);
  }

  function show(text) {
    try { fs.writeSync(2, text); } catch (e) { /* stderr gone */ }
  }

  function describe(e) {
    if (e instanceof Error && typeof e.stack === 'string') {
      // Keep the cell's frames and the code it called, drop the kernel's own.
      const lines = e.stack.split('\n').filter((l) =>
        !/^\s+at .*(\(node:|\[eval\]|evalmachine\.<anonymous>)/.test(l));
      return lines.join('\n');
    }
    return 'Uncaught ' + util.inspect(e, inspectOptions);
  }

  process.on('uncaughtException', (e) => show(describe(e) + '\n'));
  process.on('unhandledRejection', (e) => show('Unhandled rejection: ' + describe(e) + '\n'));

  // Top-level let/const -> var and `class X {}` -> `var X = class X {};`, so a later
  // cell may declare the same names again.
  function rewrite(code) {
    if (!acorn || !/\b(let|const|class)\b/.test(code)) return code; /* nothing to rewrite */
    let ast;
    try {
      ast = acorn.parse(code, { ecmaVersion: 'latest', sourceType: 'script',
        allowAwaitOutsideFunction: true, allowReturnOutsideFunction: false,
        allowHashBang: true });
    } catch (e) {
      return code; // let V8 report the syntax error
    }
    const edits = [];
    for (const node of ast.body) {
      if (node.type === 'VariableDeclaration' && (node.kind === 'let' || node.kind === 'const')) {
        edits.push([node.start, node.start + node.kind.length, 'var']);
      } else if (node.type === 'ClassDeclaration' && node.id) {
        edits.push([node.start, node.start, 'var ' + node.id.name + ' = ']);
        edits.push([node.end, node.end, ';']);
      }
    }
    let out = code;
    for (let i = edits.length - 1; i >= 0; i--) {
      const [a, b, text] = edits[i];
      out = out.slice(0, a) + text + out.slice(b);
    }
    return out;
  }

  function importer(specifier) {
    if (specifier.startsWith('./') || specifier.startsWith('../') || specifier.startsWith('/')) {
      return import(url.pathToFileURL(path.resolve(work, specifier)).href);
    }
    return import(specifier);
  }

  let n = 0;
  async function runCell(code) {
    n += 1;
    const filename = 'cell' + n + '.js';
    try {
      const src = rewrite(code);
      const wrapped = toplevelAwait && /\bawait\b/.test(src) ? toplevelAwait(src) : null;
      let value;
      if (wrapped) {
        const script = new vm.Script(wrapped, { filename, importModuleDynamically: importer });
        const r = await script.runInThisContext({ displayErrors: true });
        value = r ? r.value : undefined;
      } else {
        const script = new vm.Script(src, { filename, importModuleDynamically: importer });
        value = script.runInThisContext({ displayErrors: true });
      }
      if (value !== undefined) {
        globalThis._ = value;
        showValue(util.inspect(value, inspectOptions) + '\n');
      }
      return '0';
    } catch (e) {
      show(describe(e) + '\n');
      return '1';
    }
  }

  // Requests arrive on PREFIX-req; cells run one after another in arrival order.
  let buf = Buffer.alloc(0);
  const queue = [];
  let busy = false;
  function onFrames(chunk) {
    buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
    while (buf.length >= 4) {
      const size = buf.readUInt32LE(0);
      if (buf.length < 4 + size) break;
      queue.push(buf.subarray(4, 4 + size));
      buf = buf.subarray(4 + size);
    }
  }
  async function pump() {
    if (busy) return;
    busy = true;
    while (queue.length) {
      const req = queue.shift();
      const nonce = req.subarray(0, 32).toString('latin1');
      spawned = false;
      const status = await runCell(req.subarray(32).toString('utf8'));
      // A rejection the cell left unhandled is reported with it: one turn of the event
      // loop lets Node emit it (only then: the turn costs time every cell would pay).
      if (rejectionPending()) await new Promise((resolve) => setImmediate(resolve));
      await drained(stdout);
      await drained(stderr);
      // (while warming, stdout only: the daemon drops it before "ready", and keeps
      // stderr then for a failed start's diagnosis)
      if (warming) {
        await endMark(nonce, [1]);
      } else {
        const reply = 'D' + status + nonce + (spawned || !canTell ? '1' : '0');
        await endMark(nonce, [1, 2], reply);
      }
      if (warming && warmDone && --warmLeft === 0) warmDone();
    }
    busy = false;
    holdLoop(!idleWait || process.emit !== emitHooked);
  }

  // Where the kernel waits for its next request.  Waiting in libuv costs a cell a
  // blocking epoll_pwait, then a read; a blocking read of its own, on a second
  // descriptor of the FIFO, makes a warm cell under gVisor's ptrace platform 0.03-0.1 ms
  // cheaper (docs/performance.md §3).  The kernel reads that way only when nothing else
  // could run meanwhile, and libuv says when: the request socket is unreferenced
  // between cells, so once a cell's timers, I/O, child processes and threadpool work
  // are done Node's loop has nothing alive and emits 'beforeExit', and the kernel
  // blocks there (idle).  What an unreferenced handle might still want is
  // invisible to libuv's count, so until the next request the socket is referenced --
  // the loop waits as before -- while an unreferenced timer or immediate is pending, and
  // for good once a cell unreferenced a handle (a signal listener, a worker's port, a
  // socket), a cell is still waiting on something, or a cell replaced process.emit.
  // A cell's own 'beforeExit' listeners never hear these (Node would emit it only at
  // exit, which a kernel never reaches).
  const input = new net.Socket({ fd: reqFd, readable: true, writable: false });
  function onData(chunk) {
    onFrames(chunk);
    return pump();
  }
  input.on('data', onData);
  input.on('end', () => process.exit(0));
  input.on('error', () => process.exit(0));
  let idleWait = false; // set once ready, cleared for good by an unreferenced handle
  let blockFd = -1;
  let pending = null; // internal/timers: unreferenced timers and immediates
  const handleProto = (() => {
    let p = input._handle;
    while (p && !Object.prototype.hasOwnProperty.call(p, 'unref')) p = Object.getPrototypeOf(p);
    return p;
  })();
  const handleRef = handleProto && handleProto.ref;
  const handleUnref = handleProto && handleProto.unref;
  function holdLoop(hold) {
    if (input._handle && handleProto) (hold ? handleRef : handleUnref).call(input._handle);
  }
  const emit = process.emit;
  function emitHooked(event, ...args) {
    if (event === 'beforeExit' && idleWait) {
      idle();
      return false;
    }
    return emit.call(this, event, ...args);
  }
  function unrefPending() {
    for (const msecs in pending.timerListMap) return true; // a list per duration in use
    return pending.immediateQueue.head !== null;
  }
  const chunk = Buffer.allocUnsafe(65536);
  function idle() {
    if (busy || unrefPending() || process.emit !== emitHooked) { // (busy while queued)
      holdLoop(true); // wait the loop's way; pump() lets go again after the next cell
      return;
    }
    while (!queue.length) {
      let got;
      try {
        got = fs.readSync(blockFd, chunk, 0, chunk.length, null);
      } catch (e) {
        if (e.code === 'EINTR' || e.code === 'EAGAIN') continue;
        process.exit(0);
      }
      if (got === 0) process.exit(0);
      onFrames(Buffer.from(chunk.subarray(0, got)));
    }
    setImmediate(noop); // keeps the loop alive to come back here after this cell
    pump();
  }
  function noop() {}
  function waitHere() {
    try {
      pending = require('internal/timers');
      if (!pending.timerListMap || !pending.immediateQueue || !handleUnref) return;
      blockFd = fs.openSync(prefix + '-req', fs.constants.O_RDONLY);
    } catch (e) {
      return; // the loop's way only
    }
    handleProto.unref = function unref(...a) {
      if (idleWait) {
        idleWait = false;
        holdLoop(true);
      }
      return handleUnref.apply(this, a);
    };
    process.emit = emitHooked;
    idleWait = true;
    holdLoop(false);
  }
  // A cell's whole path once before saying ready -- frame, pump, rewrite, compile, run,
  // inspect, drain, end mark -- so that a warm sandbox's first cell does not pay for V8
  // compiling that path (0.4-0.6 ms of a pooled open + first cell; a warm-up of the
  // compile and run steps alone saved nothing there).  Nothing of it stays: no global,
  // no `_`, and the session's cells are numbered from 1.
  // The warm-up's requests are written to the request FIFO itself, so that the way in
  // -- the wait in idle() and its read -- is warm too (a bare kernel's first cell at
  // once: 0.78-1.08 -> 0.53-0.74 ms; 50 ms after ready: 1.45-1.68 -> 1.02-1.36).  The
  // daemon holds the FIFO open read-write and sends nothing before "ready", so these
  // frames are alone in it, and closing this end is no end of file.  Where the FIFO
  // cannot be opened for writing, they are handed to onData.
  (async () => {
    try {
      void process.stdout; // the streams are made on first use: make them now
      void process.stderr;
      waitHere();
      rewrite('let warm = 1; warm'); // acorn's path, run on its own: `warm` is no global
      warming = true;
      const cells = ['1', 'await 0'].map((code) => frame('0'.repeat(32) + code));
      let self = -1;
      try {
        self = fs.openSync(prefix + '-req', fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
      } catch (e) { /* handed over below */ }
      if (self >= 0) {
        warmLeft = cells.length;
        await new Promise((resolve) => {
          warmDone = resolve;
          fs.writeSync(self, Buffer.concat(cells)); // under PIPE_BUF: whole, at once
        });
        fs.closeSync(self);
      } else {
        for (const cell of cells) await onData(cell);
      }
    } catch (e) { /* never fatal */ }
    warmDone = null;
    warming = false;
    n = 0;
    delete globalThis._;
    send('R' + token);
  })();
})();
