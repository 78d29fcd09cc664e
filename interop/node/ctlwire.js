'use strict';
// A second implementation of the ctlwire wire protocol 1.0, written from
// docs/protocol.md: a minimal client (call, fan-out, timeouts, typed errors) and a
// minimal engine (serves methods in the spec's decision order, heartbeats, deadlines,
// fences, idempotency keys, the operation ledger), NULL security or CURVE.
// Orientation: the client binds a ROUTER; each engine rank connects a DEALER
// (identity rank-N) and a beacon DEALER (identity beat-N).

const codec = require('./codec');
const client = require('./client');
const engine = require('./engine');
const ledger = require('./ledger');
const curve = require('./curve');

module.exports = {
  PROTOCOL_VERSION: codec.PROTOCOL_VERSION,
  PROTOCOL_MAJOR: codec.PROTOCOL_MAJOR,
  PROTOCOL_MINOR: codec.PROTOCOL_MINOR,
  MAX_MESSAGE_SIZE: codec.MAX_MESSAGE_SIZE,
  decodeEnvelope: codec.decodeEnvelope,
  salvageId: codec.salvageId,
  encodeRequest: codec.encodeRequest,
  encodeReply: codec.encodeReply,
  encodeHeartbeat: codec.encodeHeartbeat,
  MalformedFrame: codec.MalformedFrame,
  Client: client.Client,
  CtlwireError: client.CtlwireError,
  RemoteError: client.RemoteError,
  Fenced: client.Fenced,
  UnknownMethod: client.UnknownMethod,
  Busy: client.Busy,
  RequestTimedOut: client.RequestTimedOut,
  EngineDead: client.EngineDead,
  NotDelivered: client.NotDelivered,
  OutcomeUnknown: client.OutcomeUnknown,
  UnsupportedProtocolVersion: client.UnsupportedProtocolVersion,
  Engine: engine.Engine,
  newIncarnation: engine.newIncarnation,
  NO_PAYLOAD: engine.NO_PAYLOAD,
  Ledger: ledger.Ledger,
  curveKeyPair: () => require('zeromq').curveKeyPair(),
  readKeyPair: curve.readKeyPair,
  publicKey: curve.publicKey,
};
