'use strict';
// CURVE (docs/protocol.md, Security): key pairs, the certificate files `ctlwire keys
// generate` writes, and the ZAP authenticator that allow-lists client public keys. The
// side that binds is the CURVE server and MUST install one: a CURVE server without an
// authenticator encrypts but accepts every key.

const fs = require('fs');
const zmq = require('zeromq');

const Z85 = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';

/** Z85 text of `bytes` (a multiple of 4 bytes long, as a 32-byte CURVE key is). */
function z85Encode(bytes) {
  const b = Buffer.from(bytes);
  let out = '';
  for (let i = 0; i < b.length; i += 4) {
    let v = b.readUInt32BE(i);
    let chunk = '';
    for (let j = 0; j < 5; j++) { chunk = Z85[v % 85] + chunk; v = Math.floor(v / 85); }
    out += chunk;
  }
  return out;
}

const isKey = (k) => typeof k === 'string' && k.length === 40 && [...k].every((c) => Z85.includes(c));

/** A z85 public key: given as such, or read from a certificate file (`NAME.key`). */
function publicKey(fileOrKey) {
  return isKey(fileOrKey) ? fileOrKey : readCertificate(fileOrKey).publicKey;
}

/** {publicKey, secretKey?} of a pyzmq/zcert certificate file (`public-key = "..."`). */
function readCertificate(file) {
  const text = fs.readFileSync(file, 'utf8');
  const field = (name) => (new RegExp(`^\\s*${name}\\s*=\\s*"([^"]{40})"`, 'm').exec(text) || [])[1];
  const cert = { publicKey: field('public-key'), secretKey: field('secret-key') };
  if (!isKey(cert.publicKey)) throw new Error(`${file}: no public key`);
  return cert;
}

/** The key pair in a secret certificate file (`NAME.key_secret`). */
function readKeyPair(file) {
  const cert = readCertificate(file);
  if (!isKey(cert.secretKey)) throw new Error(`${file}: no secret key`);
  return cert;
}

/**
 * The ZAP handler of this process's zeromq context: accepts a CURVE client only when its
 * public key is allow-listed, and gives the connection that key (z85) as its User-Id.
 * One per context (ZAP is per context): start it before the CURVE server binds.
 */
class Authenticator {
  constructor(allowed) {
    this.allowed = new Set(allowed);
    this.accepted = 0;
    this.rejected = 0;
  }

  async start() {
    this.sock = new zmq.Router({ linger: 0 });
    await this.sock.bind('inproc://zeromq.zap.01');
    this._loop = this._serve();
    return this;
  }

  async _serve() {
    try {
      for await (const frames of this.sock) {
        // [route, "", version, request id, domain, address, identity, mechanism, key]
        const [route, empty, , requestId, , , , mechanism, ...credentials] = frames;
        const key = credentials.length === 1 && credentials[0].length === 32 ? z85Encode(credentials[0]) : '';
        const ok = String(mechanism) === 'CURVE' && this.allowed.has(key);
        if (ok) this.accepted++; else this.rejected++;
        await this.sock.send([route, empty, '1.0', requestId, ok ? '200' : '400',
          ok ? 'OK' : 'client key not allowed', ok ? key : '', '']);
      }
    } catch (e) { /* closed */ }
  }

  close() { if (this.sock) this.sock.close(); }
}

module.exports = { Authenticator, z85Encode, publicKey, readKeyPair, isKey };
