#!/usr/bin/env node
'use strict';
// ctlwire-node: the Node.js implementation's command line.
//   node cli.js engine --connect ADDR [--rank N] [--version MAJOR.MINOR] [CURVE]
//       serve the conformance methods (docs/protocol.md, Conformance harness) until killed
//   node cli.js call --bind ADDR [--rank N] [--timeout S] [CURVE] METHOD [JSON]
//       bind, wait for the rank, call METHOD with the JSON payload, print the result as JSON
//   node cli.js conformance-client --bind ADDR [CURVE]
//       run the conformance client script against engines 0, 1 (and 2, announcing 2.0)
// CURVE (tcp): --curve-keys SECRET_FILE (this side's key pair, a `ctlwire keys generate`
// NAME.key_secret file), and for an engine --server-key KEY (the client's public key),
// for a client --allow KEY[,KEY...] --any-rank (the engines' public keys); KEY is a z85
// key or a NAME.key file. --allow-insecure-tcp: tcp without CURVE.
const ctl = require('./ctlwire');

const FLAGS = new Set(['any-rank', 'allow-insecure-tcp']);

function parse(argv) {
  const opts = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    if (!argv[i].startsWith('--')) opts._.push(argv[i]);
    else if (FLAGS.has(argv[i].slice(2))) opts[argv[i].slice(2)] = true;
    else opts[argv[i].slice(2)] = argv[++i];
  }
  return opts;
}

function curveOf(opts, side) {
  if (!opts['curve-keys']) return null;
  const keys = ctl.readKeyPair(opts['curve-keys']);
  if (side === 'engine') return { ...keys, serverKey: ctl.publicKey(opts['server-key']) };
  return { ...keys, allow: String(opts.allow || '').split(',').filter(Boolean).map(ctl.publicKey), anyRank: Boolean(opts['any-rank']) };
}

const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));

class ConformanceError extends Error { constructor(m) { super(m); this.name = 'ConformanceError'; this.code = 599; } }

const number = (v) => (typeof v === 'number' ? '' : 'expected a number');
const text = (v) => (typeof v === 'string' ? '' : 'expected a str');
const size = (v) => (Number.isInteger(v) && v >= 0 ? '' : 'expected an int >= 0');

function conformanceEngine(opts) {
  const [major, minor] = (opts.version || '1.0').split('.').map(Number);
  const engine = new ctl.Engine({ connect: opts.connect, rank: Number(opts.rank || 0), version: (major << 8) | minor,
    curve: curveOf(opts, 'engine'), allowInsecureTcp: Boolean(opts['allow-insecure-tcp']) });
  let count = 0;
  engine.method('echo', (x) => x)
    .method('count', () => ++count, { payload: ctl.NO_PAYLOAD })
    .method('sleep', async (s) => { await sleep(Number(s)); return s; }, { payload: number })
    .method('fail', (m) => { throw new ConformanceError(String(m)); }, { payload: text })
    .method('blob', (n) => 'x'.repeat(n), { payload: size })
    .method('unencodable', () => 2n ** 64n, { payload: ctl.NO_PAYLOAD });
  new ctl.Ledger({ mark: (x) => x, hold: async (s) => { await sleep(Number(s)); return s; } }).install(engine);
  return engine;
}

function outcome(step, promise) {
  return promise.then((value) => ({ step, ok: true, value }), (e) => ({
    step, ok: false, class: e.constructor.name, type: e.type ?? '', code: e.code ?? 0, message: e.message,
  }));
}

const json = (o) => JSON.stringify(o, (k, v) => (typeof v === 'bigint' ? v.toString() : v));

async function conformanceClient(opts) {
  const client = await new ctl.Client({ bind: opts.bind, ranks: [0, 1, 2], curve: curveOf(opts, 'client'),
    allowInsecureTcp: Boolean(opts['allow-insecure-tcp']) }).open();
  const out = (o) => process.stdout.write(json(o) + '\n');
  out({ step: 'bound', ok: true, value: client.address });
  out(await outcome('echo', client.call('echo', { x: [1, 'ü'] }, { rank: 0, timeout: 20 })));
  out(await outcome('unknown-method', client.call('重みを更新', null, { rank: 0, timeout: 20 })));
  out(await outcome('fail', client.call('fail', 'boom', { rank: 0, timeout: 20 })));
  out(await outcome('timeout', client.call('sleep', 2.0, { rank: 1, timeout: 0.5 })));
  const fan = await client.fanOut('echo', 'all', { ranks: [0, 1], timeout: 20 });
  out({ step: 'fan-out', ok: Object.keys(fan.errors).length === 0, value: fan.results });
  out(await outcome('version', client.call('echo', null, { rank: 2, timeout: 20 })));
  const first = await outcome('key', client.call('count', null, { rank: 0, timeout: 20, key: 'k1' }));
  const again = await outcome('key', client.call('count', null, { rank: 0, timeout: 20, key: 'k1' }));
  out({ step: 'key', ok: first.ok && again.ok, value: [first.value, again.value] });
  const rows = await outcome('error-table', client.call('error_table', null, { rank: 0, timeout: 20 }));
  const errors = [];
  for (const [type, code] of rows.ok ? rows.value : []) {
    const o = await outcome('errors', client.call('error', [type, code], { rank: 0, timeout: 20 }));
    errors.push({ type: o.type, code: o.code, class: o.class });
  }
  out({ step: 'errors', ok: rows.ok, value: errors });
  out({ step: 'done', ok: true, value: client.counters });
  client.close();
}

async function main() {
  const opts = parse(process.argv.slice(2));
  const cmd = opts._[0];
  if (cmd === 'engine') {
    const engine = await conformanceEngine(opts).open();
    process.stdout.write(JSON.stringify({ rank: engine.rank, incarnation: engine.incarnation }) + '\n');
    const stop = () => { engine.close(); process.exit(0); };
    process.on('SIGTERM', stop); process.on('SIGINT', stop);
  } else if (cmd === 'call') {
    const rank = Number(opts.rank || 0);
    const client = await new ctl.Client({ bind: opts.bind, ranks: [rank], curve: curveOf(opts, 'client'),
      allowInsecureTcp: Boolean(opts['allow-insecure-tcp']) }).open();
    try {
      const payload = opts._[2] === undefined ? null : JSON.parse(opts._[2]);
      const result = await client.call(opts._[1], payload, { rank, timeout: Number(opts.timeout || 30) });
      process.stdout.write(json(result) + '\n');
    } catch (e) {
      process.stderr.write(`${e.constructor.name}: ${e.message}\n`);
      process.exitCode = 1;
    } finally { client.close(); }
  } else if (cmd === 'conformance-client') {
    await conformanceClient(opts);
  } else {
    process.stderr.write('usage: cli.js engine|call|conformance-client ...\n');
    process.exitCode = 2;
  }
}

main().catch((e) => { process.stderr.write(`${e.stack}\n`); process.exit(1); });
