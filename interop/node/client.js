'use strict';
// The client (docs/protocol.md): binds a ROUTER; each engine rank connects a request
// DEALER (`rank-N`, under CURVE `rank-N.TAG`) and a beacon DEALER (`beat-N[.TAG]`, or a
// group beacon `beats-F-C[.TAG]`). Calls, fan-outs, deadlines, typed errors.

const zmq = require('zeromq');
const c = require('./codec');
const { Authenticator } = require('./curve');

const INCARNATION_WINDOW_MS = 60 * 1000;
const MAX_BEACON_GROUP = 1024;

// zeromq.js allows one send in progress per socket: sends go through a queue
function sender(sock) {
  let chain = Promise.resolve();
  return (frames) => {
    const sent = chain.then(() => sock.send(frames));
    chain = sent.catch(() => {});
    return sent;
  };
}

// -- identities ---------------------------------------------------------------------------
// `PREFIX-N` or `PREFIX-N.TAG`: N decimal without sign or leading zeros, at most 9
// digits; TAG 1 to 32 lowercase hex digits. {rank, tag} or null.
function splitIdentity(identity, prefix) {
  const s = Buffer.from(identity).toString('latin1');
  const m = new RegExp(`^${prefix}-(0|[1-9][0-9]{0,8})(\\.[0-9a-f]{1,32})?$`).exec(s);
  return m ? { rank: Number(m[1]), tag: m[2] || '' } : null;
}
// a group beacon: `beats-F-C[.TAG]` speaks for ranks F .. F+C-1
function groupOf(identity) {
  const s = Buffer.from(identity).toString('latin1');
  const m = /^beats-(0|[1-9][0-9]{0,8})-([1-9][0-9]{0,8})(\.[0-9a-f]{1,32})?$/.exec(s);
  if (!m || Number(m[2]) > MAX_BEACON_GROUP) return null;
  return { first: Number(m[1]), count: Number(m[2]), tag: m[3] || '' };
}
const versionText = (v) => `${Math.floor(Number(v) / 256)}.${Number(v) % 256}`;
const supported = (v) => Math.floor(Number(v) / 256) === c.PROTOCOL_MAJOR;
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
class UnknownMethod extends RemoteError {}
class Busy extends RemoteError {} // not run: a retry later is safe
class RequestTimedOut extends CtlwireError {}
class EngineDead extends CtlwireError { constructor(rank, detail) { super(`engine rank ${rank} is dead: ${detail}`); this.rank = rank; } }
class NotDelivered extends EngineDead {}
class OutcomeUnknown extends EngineDead {}
class UnsupportedProtocolVersion extends NotDelivered { get code() { return 505; } }

function remoteError(info, rank) {
  if (info.code === 505 && info.type === 'UnsupportedProtocolVersion') return new UnsupportedProtocolVersion(rank, info.message);
  if (info.code === 409 && info.type === 'Fenced') return new Fenced(info.type, info.message, info.code, rank);
  if (info.code === 404 && info.type === 'UnknownMethod') return new UnknownMethod(info.type, info.message, info.code, rank);
  if (info.code === 429 && info.type === 'Busy') return new Busy(info.type, info.message, info.code, rank);
  return new RemoteError(info.type, info.message, info.code, rank);
}

class Client {
  /**
   * `curve`: {publicKey, secretKey, allow: [z85 client keys], anyRank: true} makes the
   * ROUTER a CURVE server whose authenticator accepts only the allowed keys. zeromq.js
   * does not expose a message's ZAP User-Id, so this client cannot bind ranks to keys
   * (docs/protocol.md, Rank binding): it needs `anyRank: true`, saying that any allowed
   * key may speak for any rank.
   */
  constructor({ bind, ranks, heartbeatInterval = 0.25, misses = 4, defaultTimeout = 30, curve = null,
    allowInsecureTcp = false, maxMessageSize = c.MAX_MESSAGE_SIZE }) {
    Object.assign(this, { bind, ranks, heartbeatInterval, misses, defaultTimeout, curve, maxMessageSize });
    if (curve && !curve.anyRank) {
      throw new Error('a CURVE client needs anyRank: true (zeromq.js cannot read the ZAP User-Id '
        + 'that binds a rank to its key; any allowed key can then speak for any rank)');
    }
    if (curve && !(curve.allow && curve.allow.length)) throw new Error('a CURVE client needs an allow-list of engine keys');
    if (!curve && bind.startsWith('tcp://') && !allowInsecureTcp) {
      throw new Error(`refusing to bind ${bind} without CURVE: any process that can reach it could speak `
        + 'for any rank (pass allowInsecureTcp: true to accept that)');
    }
    this.incarnation = (2 ** 30) + Math.floor(Math.random() * 2 ** 30); // 31 bits, a Number
    this.counter = 0;
    this.pending = new Map(); // id -> {rank, resolve, reject, timer}
    this.peers = new Map(); // rank -> {incarnation, heard (ms), version}
    this.routes = new Map(); // rank -> the request identity last heard (`rank-N[.TAG]`)
    this.refused = new Map(); // rank -> announced version
    this.contactWaiters = [];
    this.counters = { dropped_protocol_version: 0, dropped_malformed: 0, late_replies: 0, stale_incarnation: 0,
      dropped_framing: 0, dropped_wrong_type: 0, dropped_impersonation: 0, implausible_incarnation: 0 };
    this.hbSeq = 0;
  }

  async open() {
    const options = { mandatory: true, linger: 0, maxMessageSize: c.backstop(this.maxMessageSize) };
    if (this.curve) {
      this.auth = await new Authenticator(this.curve.allow).start();
      Object.assign(options, { curveServer: true, curvePublicKey: this.curve.publicKey, curveSecretKey: this.curve.secretKey });
    }
    this.router = new zmq.Router(options);
    this.send = sender(this.router);
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
    if (this.auth) this.auth.close();
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

  // one frame from `identity`; `group`: a group beacon's {first, count, tag}, whose frames
  // are heartbeats of the ranks they name, within the group's ranks
  _frame(identity, data, group) {
    let who = null;
    if (group === null) {
      who = splitIdentity(identity, 'rank') || splitIdentity(identity, 'beat');
      if (who === null || !this.ranks.includes(who.rank)) return;
    }
    let env;
    try { env = c.decodeEnvelope(data, this.maxMessageSize); } catch (e) { this.counters.dropped_malformed++; return; }
    if (group !== null) {
      if (env.kind !== 'heartbeat') { this.counters.dropped_wrong_type++; return; }
      const rank = Number(env.rank);
      if (rank < group.first || rank >= group.first + group.count) { this.counters.dropped_impersonation++; return; }
      if (!this.ranks.includes(rank)) return;
      who = { rank, tag: group.tag };
    }
    const { rank } = who;
    if (env.kind === 'heartbeat') {
      if (Number(env.rank) !== rank) { this.counters.dropped_impersonation++; return; }
      if (!supported(env.version)) { this.counters.dropped_protocol_version++; this.refused.set(rank, env.version); this._contact(); return; }
      this.refused.delete(rank);
      const inc = Number(env.incarnation);
      if (inc / 4096 > Date.now() + INCARNATION_WINDOW_MS) { this.counters.implausible_incarnation++; return; }
      const peer = this.peers.get(rank);
      if (peer && inc < peer.incarnation) { this.counters.stale_incarnation++; return; }
      if (peer && inc > peer.incarnation) this._failRank(rank, 'restarted (a new incarnation)');
      this.peers.set(rank, { incarnation: inc, heard: Date.now(), version: env.version });
      this.routes.set(rank, `rank-${rank}${who.tag}`); // a heartbeat names its request route
      this._contact();
    } else if (env.kind === 'reply') {
      this.routes.set(rank, `rank-${rank}${who.tag}`);
      const p = this.pending.get(String(env.id));
      if (!p || p.rank !== rank || Number(env.rank) !== rank) { this.counters.late_replies++; return; }
      this.pending.delete(String(env.id));
      clearTimeout(p.timer);
      if (env.ok) p.resolve(env.result); else p.reject(remoteError(env.error || { type: '', message: '', code: 0 }, rank));
    } else {
      this.counters.dropped_wrong_type++;
    }
  }

  _route(rank) { return this.routes.get(rank) || `rank-${rank}`; }

  _contact() { const w = this.contactWaiters; this.contactWaiters = []; w.forEach((f) => f()); }

  _tick() {
    const now = Date.now();
    for (const [rank, peer] of this.peers) {
      if (now - peer.heard > (this.misses + 0.5) * this.heartbeatInterval * 1000) {
        this.peers.delete(rank);
        this._failRank(rank, `no heartbeat for ${this.misses} intervals`);
        continue;
      }
      this.send([this._route(rank), c.encodeHeartbeat({ rank: -1, incarnation: this.incarnation, seq: ++this.hbSeq })]).catch(() => {});
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
    if (this.refused.has(rank)) throw new UnsupportedProtocolVersion(rank, `its engine speaks protocol ${versionText(this.refused.get(rank))}, this side ${versionText(c.PROTOCOL_VERSION)}`);
    const frame = c.encodeRequest({ id: wireId, rank, method, payload, deadline: deadlineMs / 1000, seq: 0,
      client: this.incarnation, key, fence, version: _version ?? c.PROTOCOL_VERSION });
    if (frame.length > this.maxMessageSize) throw new CtlwireError(`request of ${frame.length} bytes exceeds the limit of ${this.maxMessageSize}`);
    const key_ = String(wireId);
    const result = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(key_);
        reject(new RequestTimedOut(`'${method}' got no outcome within ${timeout} s`));
      }, Math.max(0, deadlineMs - Date.now()));
      this.pending.set(key_, { rank, resolve, reject, timer });
    });
    // the beacon's connection may be up before the request connection: an unroutable
    // send is retried until the deadline (nothing was delivered meanwhile)
    for (;;) {
      try {
        await this.send([this._route(rank), frame]);
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

module.exports = {
  Client, CtlwireError, RemoteError, Fenced, UnknownMethod, Busy, RequestTimedOut, EngineDead, NotDelivered, OutcomeUnknown,
  UnsupportedProtocolVersion, splitIdentity, groupOf, supported, versionText, sender,
};
