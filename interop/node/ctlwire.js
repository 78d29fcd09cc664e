'use strict';
// A second implementation of the ctlwire wire protocol 1.0, written from
// docs/protocol.md: a minimal client (call, fan-out, timeouts, typed errors) and
// a minimal engine (serves methods, heartbeats, deadlines, fences, idempotency keys).
// Orientation: the client binds a ROUTER; each engine rank connects a DEALER
// (identity rank-N) and a beacon DEALER (identity beat-N). NULL security only.

const zmq = require('zeromq');
const msgpack = require('@msgpack/msgpack');

const PROTOCOL_MAJOR = 1;
const PROTOCOL_MINOR = 0;
const PROTOCOL_VERSION = (PROTOCOL_MAJOR << 8) | PROTOCOL_MINOR;
const MAX_MESSAGE_SIZE = 16 * 1024 * 1024;
const MAX_KEY_BYTES = 256;
const FENCE_WINDOW_US = 300 * 1e6;
const INCARNATION_WINDOW_MS = 60 * 1000;

// -- codec ----------------------------------------------------------------------------
const ENCODE = { useBigInt64: true };
const DECODE = { useBigInt64: true, maxStrLength: MAX_MESSAGE_SIZE };

// every integer as a Number when it is exactly one, else a BigInt (ids may reach 2**63)
function norm(v) {
  if (typeof v === 'bigint') {
    return (v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER)) ? Number(v) : v;
  }
  if (Array.isArray(v)) return v.map(norm);
  if (v && typeof v === 'object' && !(v instanceof Uint8Array)) {
    const o = {};
    for (const [k, x] of Object.entries(v)) o[k] = norm(x);
    return o;
  }
  return v;
}
const isInt = (v) => (typeof v === 'number' && Number.isInteger(v)) || typeof v === 'bigint';
const isNum = (v) => typeof v === 'number' || typeof v === 'bigint';
const isStr = (v) => typeof v === 'string';

class MalformedFrame extends Error {
  constructor(message, salvagedId = 0) { super(message); this.salvagedId = salvagedId; }
}

// field list per kind: [name, check, default] (docs/protocol.md, Envelopes)
const SCHEMA = {
  q: [['id', isInt], ['rank', isInt], ['method', isStr], ['payload', () => true],
    ['deadline', isNum, 0.0], ['seq', isInt, 0], ['client', isInt, 0],
    ['trace', (v) => v === null || (typeof v === 'object' && !Array.isArray(v)), null],
    ['key', isStr, ''], ['fence', isInt, 0], ['version', isInt, 256]],
  r: [['id', isInt], ['rank', isInt], ['incarnation', isInt], ['ok', (v) => typeof v === 'boolean'],
    ['result', () => true], ['error', (v) => v === null || (Array.isArray(v) && v.length >= 2), null]],
  h: [['rank', isInt], ['incarnation', isInt], ['seq', isInt, 0], ['busy', isInt, 0],
    ['method', isStr, ''], ['busy_for', isNum, 0.0], ['loops', isInt, 0],
    ['progress', isNum, -1.0], ['note', isStr, ''], ['version', isInt, 256]],
};
const KIND = { q: 'request', r: 'reply', h: 'heartbeat' };

// The id of a frame that is not a valid envelope, read from its first bytes only: an
// array header (fixarray of 2..15, array16, array32), the tag "q" (fixstr or str8) and
// an integer (any msgpack integer format); 0 when any of it is missing.
function salvageId(data) {
  const b = Buffer.from(data.buffer, data.byteOffset, Math.min(data.length, 64));
  let pos;
  if (b.length < 4) return 0;
  if (b[0] > 0x91 && b[0] <= 0x9f) pos = 1; else if (b[0] === 0xdc) pos = 3; else if (b[0] === 0xdd) pos = 5; else return 0;
  if (b[pos] === 0xa1 && b[pos + 1] === 0x71) pos += 2;
  else if (b[pos] === 0xd9 && b[pos + 1] === 0x01 && b[pos + 2] === 0x71) pos += 3;
  else return 0;
  if (pos >= b.length) return 0;
  const t = b[pos];
  if (t <= 0x7f) return t;
  if (t >= 0xe0) return t - 0x100;
  const width = { 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8 }[t];
  if (!width || pos + 1 + width > b.length) return 0;
  const raw = b.subarray(pos + 1, pos + 1 + width);
  const unsigned = BigInt('0x' + raw.toString('hex'));
  const v = t >= 0xd0 ? BigInt.asIntN(width * 8, unsigned) : unsigned;
  return norm(v);
}

function decodeEnvelope(data) {
  if (data.length > MAX_MESSAGE_SIZE) throw new MalformedFrame(`oversized frame of ${data.length} bytes`);
  const salvaged = salvageId(data);
  let arr;
  try { arr = msgpack.decode(data, DECODE); } catch (e) { throw new MalformedFrame(`not msgpack: ${e.message}`, salvaged); }
  if (!Array.isArray(arr) || arr.length < 1 || !SCHEMA[arr[0]]) throw new MalformedFrame('not a ctlwire envelope', salvaged);
  const tag = arr[0];
  const fields = SCHEMA[tag];
  const env = { kind: KIND[tag] };
  fields.forEach(([name, check, dflt], i) => {
    const has = i + 1 < arr.length;
    if (!has && dflt === undefined) throw new MalformedFrame(`missing field ${name}`, salvaged);
    const v = has ? norm(arr[i + 1]) : dflt;
    if (!check(v)) throw new MalformedFrame(`field ${name} has the wrong type`, salvaged);
    env[name] = v;
  });
  if (env.kind === 'reply' && env.error) {
    const [type, message, code = 0] = env.error;
    if (!isStr(type) || !isStr(message) || !isInt(code)) throw new MalformedFrame('bad error info');
    env.error = { type, message, code };
  }
  return env; // trailing fields of a newer minor version are ignored
}

// @msgpack/msgpack writes a Number above 2**32 as a float64: integer fields go as BigInts
// (written as 64-bit integers). Integral floats (a deadline of 0) are written as
// integers, which decoders accept where a float is expected.
const I = (x) => (typeof x === 'number' ? BigInt(x) : x);
function encodeRequest(r) {
  return msgpack.encode(['q', I(r.id), I(r.rank), r.method, r.payload ?? null, r.deadline ?? 0,
    I(r.seq ?? 0), I(r.client ?? 0), r.trace ?? null, r.key ?? '', I(r.fence ?? 0), I(r.version ?? PROTOCOL_VERSION)], ENCODE);
}
function encodeReply(r) {
  const err = r.error ? [r.error.type, r.error.message, I(r.error.code ?? 0)] : null;
  return msgpack.encode(['r', I(r.id), I(r.rank), I(r.incarnation), r.ok, r.result ?? null, err], ENCODE);
}
function encodeHeartbeat(h) {
  return msgpack.encode(['h', I(h.rank), I(h.incarnation), I(h.seq ?? 0), I(h.busy ?? 0), h.method ?? '',
    h.busy_for ?? 0.0, I(h.loops ?? 0), h.progress ?? -1.0, h.note ?? '', I(h.version ?? PROTOCOL_VERSION)], ENCODE);
}

// zeromq.js allows one send in progress per socket: sends go through a queue
function sender(sock) {
  let chain = Promise.resolve();
  return (frames) => {
    const sent = chain.then(() => sock.send(frames));
    chain = sent.catch(() => {});
    return sent;
  };
}

// -- identities and incarnations ----------------------------------------------------------
function rankOf(identity, prefix) {
  const s = Buffer.from(identity).toString('latin1');
  const m = new RegExp(`^${prefix}-(0|[1-9][0-9]{0,9})(\\.[A-Za-z0-9]+)?$`).exec(s);
  return m ? Number(m[1]) : null;
}
// a group beacon (docs/protocol.md): `beats-F-C` speaks for ranks F .. F+C-1
const MAX_BEACON_GROUP = 1024;
function groupOf(identity) {
  const s = Buffer.from(identity).toString('latin1');
  const m = /^beats-(0|[1-9][0-9]{0,8})-([1-9][0-9]{0,8})(\.[0-9a-f]{1,32})?$/.exec(s);
  if (!m || Number(m[2]) > MAX_BEACON_GROUP) return null;
  return { first: Number(m[1]), count: Number(m[2]) };
}
let lastIncarnation = 0;
function newIncarnation() {
  // milliseconds since the epoch << 12, plus 12 random bits (a Number until 2039)
  let inc = Date.now() * 4096 + Math.floor(Math.random() * 4096);
  if (inc <= lastIncarnation) inc = lastIncarnation + 1;
  lastIncarnation = inc;
  return inc;
}
const versionText = (v) => `${Math.floor(Number(v) / 256)}.${Number(v) % 256}`;
const supported = (v) => Math.floor(Number(v) / 256) === PROTOCOL_MAJOR;

const sleepMs = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// -- typed errors (the client's view) ---------------------------------------------------
class CtlwireError extends Error {}
class RemoteError extends CtlwireError {
  constructor(type, message, code, rank) {
    super(`${type}: ${message} (code ${code} from rank ${rank})`);
    Object.assign(this, { type, remoteMessage: message, code, rank });
  }
}
class Fenced extends RemoteError {}
class RequestTimedOut extends CtlwireError {}
class EngineDead extends CtlwireError { constructor(rank, detail) { super(`engine rank ${rank} is dead: ${detail}`); this.rank = rank; } }
class NotDelivered extends EngineDead {}
class OutcomeUnknown extends EngineDead {}
class UnsupportedProtocolVersion extends NotDelivered {}

function remoteError(info, rank) {
  if (info.code === 505 && info.type === 'UnsupportedProtocolVersion') return new UnsupportedProtocolVersion(rank, info.message);
  if (info.code === 409 && info.type === 'Fenced') return new Fenced(info.type, info.message, info.code, rank);
  return new RemoteError(info.type, info.message, info.code, rank);
}

// -- client -----------------------------------------------------------------------------------
class Client {
  constructor({ bind, ranks, heartbeatInterval = 0.25, misses = 4, defaultTimeout = 30 }) {
    Object.assign(this, { bind, ranks, heartbeatInterval, misses, defaultTimeout });
    this.router = new zmq.Router({ mandatory: true, linger: 0, maxMessageSize: MAX_MESSAGE_SIZE });
    this.send = sender(this.router);
    this.incarnation = (2 ** 30) + Math.floor(Math.random() * 2 ** 30); // 31 bits, a Number
    this.counter = 0;
    this.pending = new Map(); // id -> {rank, resolve, reject, timer}
    this.peers = new Map(); // rank -> {incarnation, heard (ms), version}
    this.refused = new Map(); // rank -> announced version
    this.contactWaiters = [];
    this.counters = { dropped_protocol_version: 0, dropped_malformed: 0, late_replies: 0, stale_incarnation: 0,
      dropped_framing: 0, dropped_wrong_type: 0, dropped_impersonation: 0 };
    this.hbSeq = 0;
  }

  async open() {
    await this.router.bind(this.bind);
    this.address = this.router.lastEndpoint;
    this._loop = this._receive();
    this._timer = setInterval(() => this._tick(), this.heartbeatInterval * 1000);
    return this;
  }

  close() {
    clearInterval(this._timer);
    for (const [, p] of this.pending) { clearTimeout(p.timer); p.reject(new CtlwireError('client closed')); }
    this.pending.clear();
    this.router.close();
  }

  async _receive() {
    try {
      for await (const [identity, ...frames] of this.router) {
        const group = groupOf(identity);
        if (group === null) {
          if (frames.length === 1) this._frame(identity, frames[0], null);
          else this.counters.dropped_framing++;
        } else if (frames.length > group.count) {
          this.counters.dropped_framing++; // more heartbeats than the ranks it speaks for
        } else {
          for (const data of frames) this._frame(identity, data, group);
        }
      }
    } catch (e) { /* closed */ }
  }

  // one frame from `identity`; `group`: a group beacon's {first, count}, whose frames
  // are heartbeats of the ranks they name, within the group's ranks
  _frame(identity, data, group) {
    let rank = null;
    if (group === null) {
      rank = rankOf(identity, 'rank');
      if (rank === null) rank = rankOf(identity, 'beat');
      if (rank === null || !this.ranks.includes(rank)) return;
    }
    let env;
    try { env = decodeEnvelope(data); } catch (e) { this.counters.dropped_malformed++; return; }
    if (group !== null) {
      if (env.kind !== 'heartbeat') { this.counters.dropped_wrong_type++; return; }
      rank = Number(env.rank);
      if (rank < group.first || rank >= group.first + group.count) { this.counters.dropped_impersonation++; return; }
      if (!this.ranks.includes(rank)) return;
    }
    if (env.kind === 'heartbeat') {
      if (!supported(env.version)) { this.counters.dropped_protocol_version++; this.refused.set(rank, env.version); this._contact(); return; }
      this.refused.delete(rank);
      const inc = Number(env.incarnation);
      if (inc / 4096 > Date.now() + INCARNATION_WINDOW_MS) return; // implausible
      const peer = this.peers.get(rank);
      if (peer && inc < peer.incarnation) { this.counters.stale_incarnation++; return; }
      if (peer && inc > peer.incarnation) this._failRank(rank, 'restarted (a new incarnation)');
      this.peers.set(rank, { incarnation: inc, heard: Date.now(), version: env.version });
      this._contact();
    } else if (env.kind === 'reply') {
      const p = this.pending.get(String(env.id));
      if (!p || p.rank !== rank) { this.counters.late_replies++; return; }
      this.pending.delete(String(env.id));
      clearTimeout(p.timer);
      if (env.ok) p.resolve(env.result); else p.reject(remoteError(env.error, rank));
    }
  }

  _contact() { const w = this.contactWaiters; this.contactWaiters = []; w.forEach((f) => f()); }

  _tick() {
    const now = Date.now();
    for (const [rank, peer] of this.peers) {
      if (now - peer.heard > (this.misses + 0.5) * this.heartbeatInterval * 1000) {
        this.peers.delete(rank);
        this._failRank(rank, `no heartbeat for ${this.misses} intervals`);
        continue;
      }
      this.send([`rank-${rank}`, encodeHeartbeat({ rank: -1, incarnation: this.incarnation, seq: ++this.hbSeq })]).catch(() => {});
    }
  }

  _failRank(rank, detail) {
    for (const [id, p] of this.pending) {
      if (p.rank === rank) { this.pending.delete(id); clearTimeout(p.timer); p.reject(new OutcomeUnknown(rank, detail)); }
    }
  }

  async _firstContact(rank, deadlineMs) {
    while (!this.peers.has(rank) && !this.refused.has(rank)) {
      const left = deadlineMs - Date.now();
      if (left <= 0) return false;
      await new Promise((resolve) => { const t = setTimeout(resolve, Math.min(left, 50)); this.contactWaiters.push(() => { clearTimeout(t); resolve(); }); });
    }
    return true;
  }

  /** One rank's call; rejects with a typed error. */
  async call(method, payload = null, { rank = 0, timeout, key = '', fence = 0, _id, _version } = {}) {
    timeout = timeout ?? this.defaultTimeout;
    const deadlineMs = Date.now() + timeout * 1000;
    // incarnation << 32 | counter: above 2**53, so a BigInt
    const wireId = _id ?? (BigInt(this.incarnation) << 32n) + BigInt(++this.counter);
    if (!(await this._firstContact(rank, deadlineMs))) throw new NotDelivered(rank, 'never heard from within the deadline');
    if (this.refused.has(rank)) throw new UnsupportedProtocolVersion(rank, `its engine speaks protocol ${versionText(this.refused.get(rank))}, this side ${versionText(PROTOCOL_VERSION)}`);
    const key_ = String(wireId);
    const result = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(key_);
        reject(new RequestTimedOut(`'${method}' got no outcome within ${timeout} s`));
      }, Math.max(0, deadlineMs - Date.now()));
      this.pending.set(key_, { rank, resolve, reject, timer });
    });
    const frame = encodeRequest({ id: wireId, rank, method, payload, deadline: deadlineMs / 1000, seq: 0,
      client: this.incarnation, key, fence, version: _version ?? PROTOCOL_VERSION });
    // the beacon's connection may be up before the request connection: an unroutable
    // send is retried until the deadline (nothing was delivered meanwhile)
    for (;;) {
      try {
        await this.send([`rank-${rank}`, frame]);
        break;
      } catch (e) {
        if (Date.now() + 20 < deadlineMs && this.pending.has(key_)) { await sleepMs(20); continue; }
        const p = this.pending.get(key_);
        if (p) { this.pending.delete(key_); clearTimeout(p.timer); }
        throw new NotDelivered(rank, `unroutable: ${e.message}`);
      }
    }
    return result;
  }

  /** The same call to many ranks: {results: {rank: value}, errors: {rank: error}}. */
  async fanOut(method, payload = null, { ranks = this.ranks, timeout } = {}) {
    const settled = await Promise.allSettled(ranks.map((rank) => this.call(method, payload, { rank, timeout })));
    const out = { results: {}, errors: {} };
    settled.forEach((s, i) => { if (s.status === 'fulfilled') out.results[ranks[i]] = s.value; else out.errors[ranks[i]] = s.reason; });
    return out;
  }
}

// -- engine -----------------------------------------------------------------------------------
class Engine {
  constructor({ connect, rank = 0, heartbeatInterval = 0.25, version = PROTOCOL_VERSION, incarnation }) {
    Object.assign(this, { connect, rank, heartbeatInterval, version });
    this.incarnation = incarnation ?? newIncarnation();
    this.methods = new Map();
    this.fenceHigh = 0;
    this.seen = new Set(); this.seenOrder = [];
    this.results = new Map(); // key -> {ok, result, error} | 'running'
    this.running = new Map(); // id -> {method, since}
    this.hbSeq = 0; this.loops = 0;
    this.counters = { received: 0, duplicates: 0, dropped_malformed: 0, protocol_version_refused: 0, replies: 0 };
    this.method('ctlwire.metrics', () => ({ rank: this.rank, counters: this.counters }), { readOnly: true });
  }

  method(name, fn, { readOnly = false } = {}) { this.methods.set(name, { fn, readOnly }); return this; }

  async open() {
    this.dealer = new zmq.Dealer({ routingId: `rank-${this.rank}`, linger: 0, maxMessageSize: MAX_MESSAGE_SIZE });
    this.beacon = new zmq.Dealer({ routingId: `beat-${this.rank}`, linger: 0, immediate: true, sendHighWaterMark: 4 });
    this.send = sender(this.dealer);
    this.beaconBusy = false;
    this.dealer.connect(this.connect);
    this.beacon.connect(this.connect);
    this._beat();
    this._timer = setInterval(() => this._beat(), this.heartbeatInterval * 1000);
    this._loop = this._receive();
    return this;
  }

  close() { clearInterval(this._timer); this.dealer.close(); this.beacon.close(); }

  _beat() {
    let busy = 0; let method = ''; let busyFor = 0.0;
    for (const [id, r] of this.running) { busy = id; method = r.method; busyFor = (Date.now() - r.since) / 1000; break; }
    const hb = encodeHeartbeat({ rank: this.rank, incarnation: this.incarnation, seq: ++this.hbSeq, busy, method,
      busy_for: busyFor, loops: this.loops, version: this.version });
    if (this.beaconBusy) return; // the peer is not reading: this heartbeat is dropped
    this.beaconBusy = true;
    this.beacon.send(hb).catch(() => {}).finally(() => { this.beaconBusy = false; });
  }

  async _receive() {
    try {
      for await (const [data] of this.dealer) {
        this.loops++;
        this._frame(data);
      }
    } catch (e) { /* closed */ }
  }

  _reply(id, ok, result, error) {
    this.counters.replies++;
    const frame = encodeReply({ id, rank: this.rank, incarnation: this.incarnation, ok, result, error });
    this.send(frame).catch(() => {});
  }

  _error(id, type, message, code) { this._reply(id, false, null, { type, message, code }); }

  _frame(data) {
    this.counters.received++;
    let req;
    try { req = decodeEnvelope(data); } catch (e) {
      this.counters.dropped_malformed++;
      if (e.salvagedId) this._error(e.salvagedId, 'MalformedFrame', e.message, data.length > MAX_MESSAGE_SIZE ? 413 : 400);
      return;
    }
    if (req.kind === 'heartbeat') { if (!supported(req.version)) this.counters.protocol_version_refused++; return; }
    if (req.kind !== 'request') return;
    const idKey = String(req.id);
    if (this.seen.has(idKey)) { this.counters.duplicates++; return; }
    this.seen.add(idKey); this.seenOrder.push(idKey);
    if (this.seenOrder.length > 4096) this.seen.delete(this.seenOrder.shift());
    this._admit(req);
  }

  _admit(req) {
    const { id, method } = req;
    if (!supported(req.version)) {
      this.counters.protocol_version_refused++;
      return this._error(id, 'UnsupportedProtocolVersion', `this engine speaks protocol ${versionText(PROTOCOL_VERSION)}, the request ${versionText(req.version)}`, 505);
    }
    if (Number(req.rank) !== this.rank) return this._error(id, 'WrongRank', `this is rank ${this.rank}, not ${req.rank}`, 421);
    const spec = this.methods.get(method);
    if (!spec) return this._error(id, 'UnknownMethod', `no control method '${method}' on this engine`, 404);
    const now = Date.now() / 1000;
    if (req.deadline && now > req.deadline) return this._error(id, 'DeadlineExpired', `'${method}' arrived ${(now - req.deadline).toFixed(3)} s after its deadline`, 408);
    const fence = spec.readOnly ? 0 : Number(req.fence);
    if (fence) {
      if (fence < 0 || fence > Date.now() * 1000 + FENCE_WINDOW_US) return this._error(id, 'FenceOutOfRange', `'${method}': fencing token ${req.fence} is out of range`, 416);
      if (fence < this.fenceHigh) return this._error(id, 'Fenced', `'${method}': fencing token ${fence} is older than ${this.fenceHigh}, already accepted`, 409);
    }
    const key = spec.readOnly ? '' : req.key;
    if (key) {
      if (Buffer.byteLength(key, 'utf8') > MAX_KEY_BYTES) return this._error(id, 'KeyTooLong', `'${method}': an idempotency key is at most ${MAX_KEY_BYTES} bytes`, 414);
      const recorded = this.results.get(`${method}\0${key}`);
      if (recorded === 'running') return this._error(id, 'InProgress', `'${method}': a request with this idempotency key is still running`, 425);
      if (recorded) return this._reply(id, recorded.ok, recorded.result, recorded.error);
      this.results.set(`${method}\0${key}`, 'running');
    }
    if (fence > this.fenceHigh) this.fenceHigh = fence;
    this._run(req, spec, key);
  }

  async _run(req, spec, key) {
    this.running.set(req.id, { method: req.method, since: Date.now() });
    let outcome;
    try {
      const result = await spec.fn(req.payload, req);
      outcome = { ok: true, result: result === undefined ? null : result, error: null };
    } catch (e) {
      outcome = { ok: false, result: null, error: { type: e.name && e.name !== 'Error' ? e.name : (e.constructor?.name || 'Error'), message: String(e.message ?? e), code: Number.isInteger(e.code) ? e.code : 0 } };
    } finally {
      this.running.delete(req.id);
    }
    if (key) this.results.set(`${req.method}\0${key}`, outcome);
    this._reply(req.id, outcome.ok, outcome.result, outcome.error);
  }
}

module.exports = {
  PROTOCOL_VERSION, PROTOCOL_MAJOR, PROTOCOL_MINOR, decodeEnvelope, salvageId, encodeRequest, encodeReply, encodeHeartbeat,
  Client, Engine, CtlwireError, RemoteError, Fenced, RequestTimedOut, EngineDead, NotDelivered, OutcomeUnknown,
  UnsupportedProtocolVersion, MalformedFrame, newIncarnation,
};
