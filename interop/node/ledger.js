'use strict';
// The operation ledger (docs/protocol.md, Operations: the ledger's messages): the
// methods ctlwire.step, ctlwire.take_over, ctlwire.last_operation and
// ctlwire.step_methods on an engine. Every check runs before anything changes; a refused
// step does not run, does not raise the fence and is not recorded; a step is recorded
// once its handler returned.

const c = require('./codec');

const PHASES = ['apply', 'compensate'];
const MAX_FENCE_LEAD_US = 300n * 1000000n;

class LedgerError extends Error {
  constructor(name, code, message) { super(message); this.name = name; this.code = code; }
}

const isStr = (v) => typeof v === 'string';
const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof Uint8Array);

// the shape of a StepRequest map (a payload that is not one: InvalidPayload, 422)
function stepShape(v) {
  if (!isObj(v)) return 'a StepRequest is a map';
  for (const f of ['op', 'step', 'phase', 'key', 'method']) if (!isStr(v[f])) return `field ${f} must be a str`;
  if (!c.isInt(v.fence)) return 'field fence must be an int';
  if (!('args' in v)) return 'field args is required';
  if ('index' in v && !c.isInt(v.index)) return 'field index must be an int';
  if ('ranks' in v && !(Array.isArray(v.ranks) && v.ranks.every(c.isInt))) return 'field ranks must be a list of int';
  return '';
}
const takeOverShape = (v) => (isObj(v) && c.isInt(v.fence) ? '' : 'a TakeOver is a map {fence: int}');
const noPayload = (v) => (v === null ? '' : 'takes no payload');

class Ledger {
  /** `handlers`: step method name -> fn(args) (may be async). */
  constructor(handlers, { rank = 0, maxOperations = 64 } = {}) {
    this.handlers = new Map(Object.entries(handlers));
    Object.assign(this, { rank, maxOperations });
    this.ops = new Map(); // op -> record, oldest first
    this.view = null; // the last applied (LastOperation fields)
    this.highest = 0n;
    this.inFlight = '';
  }

  install(engine) {
    this.rank = engine.rank;
    engine.method('ctlwire.step', (p, req) => this.step(p, req), { payload: stepShape })
      .method('ctlwire.take_over', (p) => this.takeOver(p), { payload: takeOverShape })
      .method('ctlwire.last_operation', () => this.lastOperation(), { readOnly: true, payload: noPayload })
      .method('ctlwire.step_methods', () => [...this.handlers.keys()].sort(), { readOnly: true, payload: noPayload });
    return engine;
  }

  _checkFence(fence, what) {
    const f = BigInt(fence);
    if (f <= 0n) throw new LedgerError('InvalidStep', 422, `${what}: a positive fencing token is required, got ${fence}`);
    const bound = BigInt(Date.now()) * 1000n + MAX_FENCE_LEAD_US;
    if (f > bound) throw new LedgerError('InvalidStep', 422, `${what}: fence ${fence} is beyond this engine's clock (bound ${bound})`);
    return f;
  }

  takeOver({ fence }) {
    const f = this._checkFence(fence, 'take-over');
    if (f < this.highest) throw new LedgerError('Fenced', 409, `take-over with fence ${f} is older than fence ${this.highest} already accepted by rank ${this.rank}`);
    if (this.inFlight) throw new LedgerError('StepInFlight', 409, `step '${this.inFlight}' is running on rank ${this.rank}; ask again once it returned`);
    this.highest = f;
    return this.lastOperation();
  }

  lastOperation() {
    const v = this.view || { rank: this.rank, op: '', step: '', phase: '', fence: 0, applied: [], highest_fence: 0, steps: [], undone: [], ranks: [] };
    return { ...v, highest_fence: this.highest };
  }

  async step(req, request) {
    // the owner: this engine's one connection, named by the request's client field (an
    // engine without routes; never the id, whose bits any request may choose apart)
    const owner = BigInt(request.client);
    if (!PHASES.includes(req.phase)) throw new LedgerError('InvalidStep', 422, `phase '${req.phase}' is not one of ${PHASES}`);
    const fence = this._checkFence(req.fence, `operation '${req.op}'`);
    const undo = req.phase === 'compensate';
    if (!req.op || !req.step || req.key !== `${req.op}:${req.step}${undo ? ':undo' : ''}`) {
      throw new LedgerError('InvalidStep', 422, `operation '${req.op}' step '${req.step}': key '${req.key}' is not the step's own`);
    }
    const fn = this.handlers.get(req.method);
    if (!fn) throw new LedgerError('UnknownStepMethod', 404, `'${req.method}' is not an operation step on this engine`);
    const index = Number(req.index ?? -1);
    if (!undo && index < 0) throw new LedgerError('InvalidStep', 422, `operation '${req.op}' step '${req.step}': a forward step carries its position in the plan`);
    if (fence < this.highest) throw new LedgerError('Fenced', 409, `operation '${req.op}' (fence ${fence}) is older than fence ${this.highest} already accepted by rank ${this.rank}`);
    const rec = this.ops.get(req.op);
    if (rec && fence === rec.fence && owner !== rec.owner) {
      throw new LedgerError('OperationOwned', 403, `operation '${req.op}' belongs to the controller that began it (fence ${rec.fence}); a successor takes it over with a newer fence`);
    }
    if (undo) {
      if (!rec || !rec.steps.includes(req.step)) throw new LedgerError('StepNotApplied', 412, `operation '${req.op}': step '${req.step}' was not applied on rank ${this.rank}; nothing to undo`);
      if (rec.undone.includes(req.step)) return this._replay(rec, `${req.step}:undo`, fence, owner);
    } else if (!rec) {
      if (index !== 0) throw new LedgerError('StepOutOfOrder', 425, `operation '${req.op}' is unknown on rank ${this.rank}; its step '${req.step}' (position ${index}) cannot come first`);
    } else {
      if (rec.undone.length) throw new LedgerError('OperationAborted', 410, `operation '${req.op}' was compensated on rank ${this.rank}; start a new operation`);
      if (index < rec.steps.length) {
        if (rec.steps[index] !== req.step || rec.methods[index] !== req.method) {
          throw new LedgerError('StepOutOfOrder', 425, `operation '${req.op}': position ${index} is '${rec.steps[index]}' here, not '${req.step}'`);
        }
        return this._replay(rec, req.step, fence, owner);
      }
      if (index > rec.steps.length || rec.steps.includes(req.step)) {
        throw new LedgerError('StepOutOfOrder', 425, `operation '${req.op}': step '${req.step}' (position ${index}) after [${rec.steps}] on rank ${this.rank}`);
      }
    }
    // fully validated: the step may raise the fence, then runs
    if (fence > this.highest) this.highest = fence;
    this.inFlight = req.step;
    let result;
    try {
      result = await fn(req.args);
    } finally {
      this.inFlight = '';
    }
    this._record(req, fence, owner, undo, result === undefined ? null : result);
    return result;
  }

  _replay(rec, name, fence, owner) {
    if (fence > this.highest) this.highest = fence;
    this._takeOver(rec, fence, owner);
    return rec.results.get(name) ?? null;
  }

  _takeOver(rec, fence, owner) {
    if (fence !== rec.fence || owner !== rec.owner) {
      Object.assign(rec, { fence, owner });
      if (this.view && this.view.op === rec.op) this.view.fence = fence;
    }
  }

  _record(req, fence, owner, undo, result) {
    let rec = this.ops.get(req.op);
    if (!rec) {
      rec = { op: req.op, fence, owner, ranks: [...(req.ranks || [])], steps: [], methods: [], undone: [], history: [], results: new Map() };
      this.ops.set(req.op, rec);
      while (this.ops.size > this.maxOperations) this.ops.delete(this.ops.keys().next().value);
    } else {
      this._takeOver(rec, fence, owner);
      this.ops.delete(req.op); this.ops.set(req.op, rec); // the newest
    }
    const name = undo ? `${req.step}:undo` : req.step;
    if (undo) rec.undone.push(req.step); else { rec.steps.push(req.step); rec.methods.push(req.method); }
    rec.history.push(name);
    rec.results.set(name, result);
    this.view = { rank: this.rank, op: rec.op, step: req.step, phase: req.phase, fence: rec.fence, applied: [...rec.history],
      highest_fence: 0, steps: [...rec.steps], undone: [...rec.undone], ranks: [...rec.ranks] };
  }
}

module.exports = { Ledger, LedgerError };
