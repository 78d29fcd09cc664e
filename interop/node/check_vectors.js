'use strict';
// Decode every conformance vector (protocol/vectors) with this implementation and
// print, as a JSON list, every vector whose decoding differs from its meaning.
// Integers above 2**53 are compared as decimal strings (JSON numbers cannot hold them).
const fs = require('fs');
const path = require('path');
const c = require('./ctlwire');

const dir = process.argv[2] || path.join(__dirname, '..', '..', 'protocol', 'vectors');
const text = (x) => JSON.stringify(x, (k, v) => (typeof v === 'bigint' ? v.toString() : v));
const bad = [];
for (const f of fs.readdirSync(dir).filter((n) => n.endsWith('.json')).sort()) {
  const raw = fs.readFileSync(path.join(dir, f), 'utf8');
  const v = JSON.parse(raw);
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
  // exact integers from the file's text: "name": 12345678901234567890
  const exact = {};
  for (const m of raw.matchAll(/"(\w+)": (-?\d{16,})/g)) exact[m[1]] = m[2];
  for (const [k, want] of Object.entries(v.meaning.fields)) {
    if (k.endsWith('_hex')) continue;
    const got = env[k];
    if (k in exact) {
      if (String(got) !== exact[k]) bad.push(`${f}: ${k} = ${got}, expected ${exact[k]}`);
      continue;
    }
    if (text(got) !== text(want)) bad.push(`${f}: ${k} = ${text(got)}, expected ${text(want)}`);
  }
}
process.stdout.write(JSON.stringify(bad) + '\n');
