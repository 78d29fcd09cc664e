'use strict';
// The engine (docs/protocol.md): a request DEALER (`rank-N`, under CURVE `rank-N.TAG`)
// and a beacon DEALER (`beat-N[.TAG]`) connected to the client's ROUTER. Requests are
// checked on arrival in the spec's decision order ("What an engine does with a
// request"), then run in arrival order, one at a time per method (its concurrency),
// different methods concurrently; heartbeats from a socket of their own.

const crypto = require('crypto');
const zmq = require('zeromq');
const c = require('./codec');
const { sender, supported, versionText } = require('./client');

const MAX_KEY_BYTES = 256;
const SEEN_IDS = 4096; // ids remembered (one route: the client this engine dialed)
const MAX_QUEUED = 64; // requests waiting for their method (one connection): past it, Busy (429)
const MAX_LANE = 256; // requests waiting for one method: past it, Busy (429)
const NO_PAYLOAD = (v) => (v === null ? '' : 'takes no payload');
const ANY = () => '';

let lastIncarnation = 0;
function newIncarnation() {
  // milliseconds since the epoch << 12, plus 12 random bits (a Number until 2039)
  let inc = Date.now() * 4096 + Math.floor(Math.random() * 4096);
  if (inc <= lastIncarnation) inc = lastIncarnation + 1;
  lastIncarnation = inc;
  return inc;
}

/**
 * Idempotency keys (docs/protocol.md, Idempotency keys): outcomes recorded under
 * (scope, method, key), at most `maxEntries` and `maxBytes`; an outcome is kept at least
 * `retentionMs`, and a new key that fits no more without evicting a younger one is
 * refused (CacheFull, 507).
 */
class ResultCache {
  constructor({ maxEntries = 4096, maxBytes = 64 * 1024 * 1024, retentionMs = 600 * 1000 } = {}) {
    Object.assign(this, { maxEntries, maxBytes, retentionMs });
    this.entries = new Map(); // "scope\0method\0key" -> {outcome: null (running) | {...}, bytes, at}
    this.bytes = 0;
  }

  static id(scope, method, key) { return `${scope}\0${method}\0${key}`; }

  lookup(id) { const e = this.entries.get(id); return e === undefined ? undefined : (e.outcome ?? 'running'); }

  /** Reserve `id` for a run starting now; false when the cache has no room. */
  start(id, now) {
    const bytes = Buffer.byteLength(id);
    for (const [old, e] of this.entries) { // oldest first; running entries stay
      if (this.entries.size < this.maxEntries && this.bytes + bytes <= this.maxBytes) break;
      if (e.outcome !== null && now - e.at >= this.retentionMs) { this.entries.delete(old); this.bytes -= e.bytes; }
    }
    if (this.entries.size >= this.maxEntries || this.bytes + bytes > this.maxBytes) return false;
    this.entries.set(id, { outcome: null, bytes, at: now });
    this.bytes += bytes;
    return true;
  }

  finish(id, outcome, size, now) {
    const e = this.entries.get(id);
    if (!e) return;
    this.bytes += size;
    Object.assign(e, { outcome, bytes: e.bytes + size, at: now });
  }

  abandon(id) { const e = this.entries.get(id); if (e) { this.entries.delete(id); this.bytes -= e.bytes; } }
}

class Engine {
  /**
   * `curve`: {publicKey, secretKey, serverKey} connects as a CURVE client of the client's
   * ROUTER (serverKey: its public key); the identities then carry a random tag.
   */
  constructor({ connect, rank = 0, heartbeatInterval = 0.25, version = c.PROTOCOL_VERSION, incarnation,
    curve = null, allowInsecureTcp = false, maxMessageSize = c.MAX_MESSAGE_SIZE, fenceWindow = 300,
    cache = {} }) {
    Object.assign(this, { connect, rank, heartbeatInterval, version, curve, maxMessageSize, fenceWindow });
    if (!curve && connect.startsWith('tcp://') && !allowInsecureTcp) {
      throw new Error(`refusing to connect to ${connect} without CURVE (pass allowInsecureTcp: true to accept that)`);
    }
    this.incarnation = incarnation ?? newIncarnation();
    this.tag = curve ? `.${crypto.randomBytes(8).toString('hex')}` : '';
    this.methods = new Map();
    this.lanes = new Map(); // method -> {running, queue}
    this.queued = 0;
    this.fenceHigh = 0n;
    this.seen = new Set(); this.seenOrder = [];
    this.results = new ResultCache(cache);
    this.running = new Map(); // id -> {method, since}
    this.hbSeq = 0; this.loops = 0;
    this.counters = { received: 0, duplicates: 0, dropped_malformed: 0, dropped_oversized: 0, dropped_wrong_type: 0,
      protocol_version_refused: 0, replies: 0, rejected: 0, idempotency_cache_full: 0, results_not_encodable: 0,
      replies_too_large: 0 };
    this.method('ctlwire.metrics', () => ({ rank: this.rank, counters: this.counters }), { readOnly: true, payload: NO_PAYLOAD });
  }

  /**
   * Serve `name` with `fn(payload, request)`. `payload(v)`: '' when `v` is a valid
   * payload, else why not (InvalidPayload, 422); `readOnly`: a query (no fence, no key);
   * `concurrency`: how many of its requests run at once (in arrival order).
   */
  method(name, fn, { readOnly = false, concurrency = 1, payload = ANY } = {}) {
    this.methods.set(name, { name, fn, readOnly, concurrency, payload });
    return this;
  }

  async open() {
    const curve = this.curve ? { curvePublicKey: this.curve.publicKey, curveSecretKey: this.curve.secretKey,
      curveServerKey: this.curve.serverKey } : {};
    this.dealer = new zmq.Dealer({ routingId: `rank-${this.rank}${this.tag}`, linger: 200,
      maxMessageSize: c.backstop(this.maxMessageSize), ...curve });
    this.beacon = new zmq.Dealer({ routingId: `beat-${this.rank}${this.tag}`, linger: 0, immediate: true,
      sendHighWaterMark: 4, receiveHighWaterMark: 4, maxMessageSize: 4096, ...curve });
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
    const hb = c.encodeHeartbeat({ rank: this.rank, incarnation: this.incarnation, seq: ++this.hbSeq, busy, method,
      busy_for: busyFor, loops: this.loops, version: this.version });
    if (this.beaconBusy) return; // the peer is not reading: this heartbeat is dropped
    this.beaconBusy = true;
    this.beacon.send(hb).catch(() => {}).finally(() => { this.beaconBusy = false; });
  }

  async _receive() {
    try {
      for await (const [data] of this.dealer) {
        this.loops++;
        this._frame(data); // never waits: a request with no room to wait is refused Busy
      }
    } catch (e) { /* closed */ }
  }

  _reply(id, ok, result, error) {
    this.counters.replies++;
    this.send(c.encodeReply({ id, rank: this.rank, incarnation: this.incarnation, ok, result, error })).catch(() => {});
  }

  _error(id, type, message, code) {
    this.counters.rejected++;
    this._reply(id, false, null, { type, message, code });
  }

  _frame(data) {
    this.counters.received++;
    let req;
    try { req = c.decodeEnvelope(data, this.maxMessageSize); } catch (e) {
      this.counters[e.oversized ? 'dropped_oversized' : 'dropped_malformed']++;
      // an id read from the frame's first bytes is answered; it does not count as seen
      if (e.salvagedId) this._error(e.salvagedId, e.oversized ? 'OversizedFrame' : 'MalformedFrame', e.message, e.oversized ? 413 : 400);
      return;
    }
    if (req.kind === 'heartbeat') { if (!supported(req.version)) this.counters.protocol_version_refused++; return; }
    if (req.kind !== 'request') { this.counters.dropped_wrong_type++; return; }
    const idKey = String(req.id);
    if (this.seen.has(idKey)) { this.counters.duplicates++; return; }
    this.seen.add(idKey); this.seenOrder.push(idKey);
    if (this.seenOrder.length > SEEN_IDS) this.seen.delete(this.seenOrder.shift());
    this._admit(req);
  }

  // docs/protocol.md, "What an engine does with a request", steps 3 to 10 (1 and 2 above)
  _admit(req) {
    const { id, method } = req;
    if (!supported(req.version)) {
      this.counters.protocol_version_refused++;
      return this._error(id, 'UnsupportedProtocolVersion', `this engine speaks protocol ${versionText(c.PROTOCOL_VERSION)}, the request ${versionText(req.version)}`, 505);
    }
    if (BigInt(req.rank) !== BigInt(this.rank)) return this._error(id, 'WrongRank', `this is rank ${this.rank}, not ${req.rank}`, 421);
    const spec = this.methods.get(method);
    if (!spec) return this._error(id, 'UnknownMethod', `no control method '${method}' on this engine`, 404);
    if (this._expired(req)) return this._expire(req);
    const fence = spec.readOnly ? 0n : BigInt(req.fence);
    if (fence !== 0n) {
      const limit = BigInt(Date.now()) * 1000n + BigInt(this.fenceWindow) * 1000000n;
      if (fence < 0n || fence > limit) return this._error(id, 'FenceOutOfRange', `'${method}': fencing token ${req.fence} is outside 1..${limit}`, 416);
      if (fence < this.fenceHigh) return this._error(id, 'Fenced', `'${method}': fencing token ${fence} is older than ${this.fenceHigh}, already accepted`, 409);
    }
    const key = spec.readOnly ? '' : req.key;
    // a DEALER engine has one connection, which the request's client field names: keys are
    // scoped by it (docs/protocol.md, Idempotency keys)
    const entry = key ? ResultCache.id(String(req.client), method, key) : '';
    if (key) {
      if (Buffer.byteLength(key, 'utf8') > MAX_KEY_BYTES) return this._error(id, 'KeyTooLong', `'${method}': an idempotency key is at most ${MAX_KEY_BYTES} bytes`, 414);
      const recorded = this.results.lookup(entry);
      if (recorded === 'running') return this._error(id, 'InProgress', `'${method}': a request with this idempotency key is still running`, 425);
      if (recorded) return this._reply(id, recorded.ok, recorded.result, recorded.error);
    }
    const wrong = spec.payload(req.payload);
    if (wrong) return this._error(id, 'InvalidPayload', `'${method}': ${wrong}`, 422);
    if (key && !this.results.start(entry, Date.now())) {
      this.counters.idempotency_cache_full++;
      return this._error(id, 'CacheFull', `'${method}': the idempotency cache has no room for a new key; not run, retry later`, 507);
    }
    const lane = this.lanes.get(spec.name);
    if (lane && lane.running >= spec.concurrency
        && (this.queued >= MAX_QUEUED || lane.queue.length >= MAX_LANE)) {
      if (entry) this.results.abandon(entry); // refused before it ran: it holds no key
      this.counters.busy = (this.counters.busy || 0) + 1;
      return this._error(id, 'Busy', `'${method}': no room to queue it (${this.queued} waiting); not run, retry later`, 429);
    }
    if (fence > this.fenceHigh) this.fenceHigh = fence;
    this._enqueue({ req, spec, entry });
    return undefined;
  }

  _expired(req) { return req.deadline && Date.now() / 1000 > req.deadline; }

  _expire(req) {
    return this._error(req.id, 'DeadlineExpired', `'${req.method}' arrived ${(Date.now() / 1000 - req.deadline).toFixed(3)} s after its deadline`, 408);
  }

  _enqueue(item) {
    let lane = this.lanes.get(item.spec.name);
    if (!lane) { lane = { running: 0, queue: [] }; this.lanes.set(item.spec.name, lane); }
    lane.queue.push(item);
    this.queued++;
    this._pump(lane);
  }

  _pump(lane) {
    while (lane.queue.length && lane.running < lane.queue[0].spec.concurrency) {
      const item = lane.queue.shift();
      this.queued--;
      lane.running++;
      this._run(item).finally(() => { lane.running--; this._pump(lane); });
    }
  }

  async _run({ req, spec, entry }) {
    if (this._expired(req)) { // the deadline is checked again when the request starts
      if (entry) this.results.abandon(entry);
      this._expire(req);
      return;
    }
    this.running.set(req.id, { method: req.method, since: Date.now() });
    let outcome;
    try {
      const result = await spec.fn(req.payload, req);
      const why = c.unencodable(result);
      outcome = why
        ? { ok: false, result: null, error: { type: 'ResultNotEncodable', message: `'${req.method}': cannot encode ${why}`, code: 500 } }
        : { ok: true, result: result === undefined ? null : result, error: null };
      if (why) this.counters.results_not_encodable++;
    } catch (e) {
      outcome = { ok: false, result: null, error: { type: e.name && e.name !== 'Error' ? e.name : (e.constructor?.name || 'Error'), message: String(e.message ?? e), code: Number.isInteger(e.code) ? e.code : 0 } };
    } finally {
      this.running.delete(req.id);
    }
    let frame = c.encodeReply({ id: req.id, rank: this.rank, incarnation: this.incarnation, ...outcome });
    if (frame.length > this.maxMessageSize) {
      this.counters.replies_too_large++;
      outcome = { ok: false, result: null, error: { type: 'ReplyTooLarge', message: `frame of ${frame.length} bytes exceeds the limit of ${this.maxMessageSize} bytes`, code: 413 } };
      frame = c.encodeReply({ id: req.id, rank: this.rank, incarnation: this.incarnation, ...outcome });
    }
    if (entry) this.results.finish(entry, outcome, frame.length, Date.now());
    this.counters.replies++;
    this.send(frame).catch(() => {});
  }
}

module.exports = { Engine, ResultCache, newIncarnation, NO_PAYLOAD, ANY };
