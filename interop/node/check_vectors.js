'use strict';
// Decode every conformance vector (protocol/vectors) with this implementation and
// print, as a JSON list, every vector whose decoding differs from its meaning.
// Integers of 16 digits or more are read from the file's text, exactly (JSON numbers are
// doubles), wherever they are, and compared as integers.
const fs = require('fs');
const path = require('path');
const c = require('./ctlwire');
const { norm } = require('./codec');

const dir = process.argv[2] || path.join(__dirname, '..', '..', 'protocol', 'vectors');
const text = (x) => JSON.stringify(x, (k, v) => (typeof v === 'bigint' ? `#${v}` : v));
// the file's JSON with every long integer as an exact integer (a Number where it is one)
const exactJson = (raw) => JSON.parse(raw.replace(/([:[,]\s*)(-?\d{16,})(?=\s*[,}\]])/g, '$1"#$2"'),
  (k, v) => (typeof v === 'string' && /^#-?\d+$/.test(v) ? norm(BigInt(v.slice(1))) : v));
const bad = [];
for (const f of fs.readdirSync(dir).filter((n) => n.endsWith('.json')).sort()) {
  const v = exactJson(fs.readFileSync(path.join(dir, f), 'utf8'));
  const data = Buffer.from(v.hex, 'hex');
  if (v.expect === 'reject') {
    try {
      c.decodeEnvelope(data);
      bad.push(`${f}: accepted`);
    } catch (e) {
      if (String(e.salvagedId || 0) !== String(v.salvaged_id)) bad.push(`${f}: salvaged ${e.salvagedId}`);
    }
    continue;
  }
  if (v.meaning.kind === 'value') continue;
  let env;
  try { env = c.decodeEnvelope(data); } catch (e) { bad.push(`${f}: ${e.message}`); continue; }
  for (const [k, want] of Object.entries(v.meaning.fields)) {
    if (k.endsWith('_hex')) continue;
    const got = env[k];
    if (text(got) !== text(want)) bad.push(`${f}: ${k} = ${text(got)}, expected ${text(want)}`);
  }
}
process.stdout.write(JSON.stringify(bad) + '\n');
