'use strict';
// Envelopes to bytes and back (docs/protocol.md, Envelopes): the three kinds, each
// field's type and range, the id of a frame that is not a valid envelope, and
// whether a handler's result has a MessagePack form at all.

const msgpack = require('@msgpack/msgpack');

const PROTOCOL_MAJOR = 1;
const PROTOCOL_MINOR = 0;
const PROTOCOL_VERSION = (PROTOCOL_MAJOR << 8) | PROTOCOL_MINOR;
// the protocol's frame limit; libzmq's MAXMSGSIZE is a backstop a sixteenth above it,
// so a frame in between is read whole and answered OversizedFrame (413)
const MAX_MESSAGE_SIZE = 16 * 1024 * 1024;
const backstop = (limit) => limit + Math.max(64 * 1024, Math.floor(limit / 16));
const MAX_RANK = 999999999;
const ID_MAX = 2n ** 64n - 1n; // ids are 1 .. 2**64 - 1
const INT_MIN = -(2n ** 63n); // MessagePack's integers: -2**63 .. 2**64 - 1

const ENCODE = { useBigInt64: true };
const DECODE = { useBigInt64: true, maxStrLength: MAX_MESSAGE_SIZE };

// A float as decoded, kept apart from integers until the envelope's fields are checked:
// a float where an integer is expected is malformed, even 2.0 (JavaScript has one
// number type, so the decoder must say which MessagePack type a number had).
class Float { constructor(value) { this.value = value; } }
class TypedDecoder extends msgpack.Decoder {
  readF32() { return new Float(super.readF32()); }
  readF64() { return new Float(super.readF64()); }
}
const decoder = new TypedDecoder(DECODE);

// every integer as a Number when it is exactly one, else a BigInt (ids may reach 2**64 - 1);
// floats as Numbers
function norm(v) {
  if (v instanceof Float) return v.value;
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
const isStr = (v) => typeof v === 'string';
const any = () => true;
// an integer in lo .. hi (BigInt bounds)
const between = (lo, hi) => (v) => isInt(v) && BigInt(v) >= lo && BigInt(v) <= hi;
// seconds: 0 or positive and finite (NaN and infinities refused)
const seconds = (v) => (typeof v === 'number' && v >= 0 && v <= Number.MAX_VALUE)
  || (typeof v === 'bigint' && v >= 0n);
const progress = (v) => (typeof v === 'number' && v <= 1) || (typeof v === 'bigint' && v <= 1n);
const count = between(0n, ID_MAX);
const version = between(0n, 0xffffn);
// decode bounds (docs/protocol.md, Limits): a request's method and its trace map
const MAX_METHOD_CHARS = 256;
const MAX_TRACE_ENTRIES = 16;
const MAX_TRACE_KEY_CHARS = 256;
const MAX_TRACE_VALUE_CHARS = 8192;
// at most `max` characters (Unicode code points, not UTF-16 units)
function chars(s, max) {
  if (s.length <= max) return true; // code points <= UTF-16 units
  if (s.length > 2 * max) return false; // code points >= units / 2
  let n = 0;
  for (const _ of s) if (++n > max) return false; // eslint-disable-line no-unused-vars
  return true;
}
const method = (v) => isStr(v) && chars(v, MAX_METHOD_CHARS);
const trace = (v) => v === null || (typeof v === 'object' && !Array.isArray(v) && !(v instanceof Uint8Array)
  && Object.keys(v).length <= MAX_TRACE_ENTRIES
  && Object.entries(v).every(([k, x]) => chars(k, MAX_TRACE_KEY_CHARS) && isStr(x) && chars(x, MAX_TRACE_VALUE_CHARS)));
// an ErrorInfo: [type, message, code = 0, ...ignored]; fewer than two elements, or an
// element of the wrong type (a float code included), is malformed
const errorInfo = (v) => v === null || (Array.isArray(v) && v.length >= 2 && isStr(v[0]) && isStr(v[1])
  && (v.length < 3 || (!(v[2] instanceof Float) && isInt(v[2]))));

class MalformedFrame extends Error {
  constructor(message, salvagedId = 0, oversized = false) {
    super(message);
    this.salvagedId = salvagedId;
    this.oversized = oversized;
  }
}

// field list per kind: [name, check, default] (docs/protocol.md, Envelopes); the checks
// of float fields are `seconds` and `progress`, and only they accept a float
const SCHEMA = {
  q: [['id', between(1n, ID_MAX)], ['rank', isInt], ['method', method], ['payload', any],
    ['deadline', seconds, 0.0], ['seq', count, 0], ['client', isInt, 0], ['trace', trace, null],
    ['key', isStr, ''], ['fence', isInt, 0], ['version', version, PROTOCOL_VERSION]],
  r: [['id', between(1n, ID_MAX)], ['rank', between(0n, BigInt(MAX_RANK))], ['incarnation', count],
    ['ok', (v) => typeof v === 'boolean'], ['result', any],
    ['error', errorInfo, null]],
  h: [['rank', between(-1n, BigInt(MAX_RANK))], ['incarnation', count], ['seq', count, 0],
    ['busy', count, 0], ['method', isStr, ''], ['busy_for', seconds, 0.0], ['loops', count, 0],
    ['progress', progress, -1.0], ['note', isStr, ''], ['version', version, PROTOCOL_VERSION]],
};
const KIND = { q: 'request', r: 'reply', h: 'heartbeat' };

// The id of a frame that is not a valid envelope, read from its first bytes only: an
// array header (fixarray of 2..15, array16, array32), the tag "q" (fixstr or str8) and
// an integer in 1 .. 2**64 - 1 (any msgpack integer format); 0 when any of it is missing.
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
  const width = { 0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8, 0xd0: 1, 0xd1: 2, 0xd2: 4, 0xd3: 8 }[t];
  if (!width || pos + 1 + width > b.length) return 0;
  const raw = b.subarray(pos + 1, pos + 1 + width);
  const unsigned = BigInt('0x' + raw.toString('hex'));
  const v = t >= 0xd0 ? BigInt.asIntN(width * 8, unsigned) : unsigned;
  return v > 0n ? norm(v) : 0;
}

function decodeEnvelope(data, limit = MAX_MESSAGE_SIZE) {
  if (data.length > limit) {
    throw new MalformedFrame(`frame of ${data.length} bytes exceeds the limit of ${limit} bytes`, salvageId(data), true);
  }
  const salvaged = salvageId(data);
  let arr;
  try { arr = decoder.decode(data); } catch (e) { throw new MalformedFrame(`not msgpack: ${e.message}`, salvaged); }
  if (!Array.isArray(arr) || arr.length < 1 || !SCHEMA[arr[0]]) throw new MalformedFrame('not a ctlwire envelope', salvaged);
  const tag = arr[0];
  const env = { kind: KIND[tag] };
  SCHEMA[tag].forEach(([name, check, dflt], i) => {
    const has = i + 1 < arr.length;
    if (!has && dflt === undefined) throw new MalformedFrame(`missing field ${name}`, salvaged);
    const floatOk = check === seconds || check === progress || check === any;
    if (has && arr[i + 1] instanceof Float && !floatOk) throw new MalformedFrame(`field ${name} is a float, not an integer`, salvaged);
    if (check === errorInfo && has && !errorInfo(arr[i + 1])) throw new MalformedFrame('bad error info');
    const v = has ? norm(arr[i + 1]) : dflt;
    if (!check(v)) throw new MalformedFrame(`field ${name} has the wrong type or is out of range`, salvaged);
    env[name] = v;
  });
  if (env.kind === 'reply' && env.error) {
    const [type, message, code = 0] = env.error; // elements after the code are ignored
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

// Why `v` has no MessagePack form (docs/protocol.md, Payloads and results), or '' when it
// has one: an integer outside -2**63 .. 2**64 - 1 (the encoder would wrap it), a string
// that is not well-formed Unicode (a lone surrogate), a function or symbol, an object
// that is not a plain object, array, Map or byte array, or nesting beyond the encoder's.
function unencodable(v, depth = 0) {
  if (depth > 100) return 'nested deeper than 100';
  if (v === null || v === undefined || typeof v === 'boolean' || typeof v === 'number') return '';
  if (typeof v === 'bigint') return (v < INT_MIN || v > ID_MAX) ? `integer ${v} is outside -2**63 .. 2**64 - 1` : '';
  if (typeof v === 'string') return v.isWellFormed() ? '' : 'a string with a lone surrogate';
  if (typeof v !== 'object') return `a ${typeof v}`;
  if (v instanceof Uint8Array) return '';
  let items;
  if (Array.isArray(v)) items = v;
  else if (v instanceof Map) items = [...v.keys(), ...v.values()];
  else if ([Object.prototype, null].includes(Object.getPrototypeOf(v))) items = Object.values(v);
  else return `an object of class ${v.constructor?.name ?? '?'}`;
  for (const x of items) {
    const why = unencodable(x, depth + 1);
    if (why) return why;
  }
  return '';
}

module.exports = {
  PROTOCOL_MAJOR, PROTOCOL_MINOR, PROTOCOL_VERSION, MAX_MESSAGE_SIZE, MAX_RANK, MAX_METHOD_CHARS, backstop, norm, isInt,
  MalformedFrame, salvageId, decodeEnvelope, encodeRequest, encodeReply, encodeHeartbeat, unencodable,
  encodeValue: (v) => msgpack.encode(v, ENCODE),
  decodeValue: (b) => norm(decoder.decode(b)),
};
