#!/usr/bin/env node
'use strict';
// ctlwire-node: the Node.js implementation's command line.
//   node cli.js engine --connect ADDR [--rank N] [--version MAJOR.MINOR]
//       serve the conformance methods (docs/protocol.md, Conformance) until killed
//   node cli.js call --bind ADDR [--rank N] [--timeout S] METHOD [JSON]
//       bind, wait for the rank, call METHOD with the JSON payload, print the result as JSON
//   node cli.js conformance-client --bind ADDR
//       run the conformance client script against engines 0, 1 (and 2, announcing 2.0)
const ctl = require('./ctlwire');

function parse(argv) {
  const opts = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opts[argv[i].slice(2)] = argv[++i]; else opts._.push(argv[i]);
  }
  return opts;
}

const sleep = (s) => new Promise((r) => setTimeout(r, s * 1000));

class ConformanceError extends Error { constructor(m) { super(m); this.name = 'ConformanceError'; this.code = 599; } }

function conformanceEngine(opts) {
  const [major, minor] = (opts.version || '1.0').split('.').map(Number);
  const engine = new ctl.Engine({ connect: opts.connect, rank: Number(opts.rank || 0), version: (major << 8) | minor });
  let count = 0;
  engine.method('echo', (x) => x)
    .method('count', () => ++count)
    .method('sleep', async (s) => { await sleep(Number(s)); return s; })
    .method('fail', (m) => { throw new ConformanceError(String(m)); });
  return engine;
}

function outcome(step, promise) {
  return promise.then((value) => ({ step, ok: true, value }), (e) => ({
    step, ok: false, class: e.constructor.name, type: e.type ?? '', code: e.code ?? 0, message: e.message,
  }));
}

async function conformanceClient(opts) {
  const client = await new ctl.Client({ bind: opts.bind, ranks: [0, 1, 2] }).open();
  const out = (o) => process.stdout.write(JSON.stringify(o, (k, v) => (typeof v === 'bigint' ? v.toString() : v)) + '\n');
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
    const client = await new ctl.Client({ bind: opts.bind, ranks: [rank] }).open();
    try {
      const payload = opts._[2] === undefined ? null : JSON.parse(opts._[2]);
      const result = await client.call(opts._[1], payload, { rank, timeout: Number(opts.timeout || 30) });
      process.stdout.write(JSON.stringify(result, (k, v) => (typeof v === 'bigint' ? v.toString() : v)) + '\n');
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
