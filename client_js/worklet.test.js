// The jitter buffer's rules, run outside a browser: worklet.js against stand-ins for the AudioWorklet globals.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { beforeEach, test } from 'node:test';

import { SOURCE, TARGET, inlineWorklet } from './tools/inline-worklet.js';
import { WORKLET_SOURCE } from './worklet_source.js';

/** @type {any} */
let Processor;
globalThis.AudioWorkletProcessor = class {
  constructor() {
    this.port = { posted: [], postMessage(message) { this.posted.push(message); } };
  }
};
globalThis.registerProcessor = (_name, cls) => { Processor = cls; };
await import('./worklet.js');

const QUANTUM = 128;
let player;

beforeEach(() => {
  player = new Processor({ processorOptions: { leadSamples: 256, fadeSamples: 64 } });
});

/** Render `quanta` blocks; returns the samples output. */
function render(quanta = 1) {
  const out = [];
  for (let i = 0; i < quanta; i++) {
    const block = new Float32Array(QUANTUM);
    player.process([], [[block]]);
    out.push(...block);
  }
  return out;
}

const push = (length, marks = {}) => {
  const samples = new Float32Array(length).fill(0.5);
  player.receive({ type: 'push', samples, utterance: 0, first: false, segmentStart: false, ...marks });
};
const posted = (type) => player.port.posted.filter((message) => message.type === type);

test('playback waits for the lead, then plays every sample once', () => {
  push(200, { first: true, segmentStart: true });
  assert.deepEqual(render(), new Array(QUANTUM).fill(0));
  push(200);
  const out = render(4);
  assert.equal(out.filter((x) => x === 0.5).length, 400);
  assert.equal(player.played, 400);
  assert.deepEqual(posted('playing'), [{ type: 'playing', utterance: 0 }]);
});

test('running dry mid-sentence is an underrun; playback then waits for the lead again', () => {
  push(256, { first: true, segmentStart: true });
  render(2);
  push(100); // more of the same sentence, late
  assert.equal(player.underruns, 1);
  assert.deepEqual(posted('underrun'), [{ type: 'underrun', utterance: 0 }]);
  assert.equal(render().filter((x) => x !== 0).length, 0); // below the lead: silence, not a stutter
});

test('a gap before a new sentence is no underrun', () => {
  push(256, { first: true, segmentStart: true });
  render(2);
  push(256, { segmentStart: true });
  assert.equal(player.underruns, 0);
});

test('drain plays what is left below the lead, and its end is no underrun', () => {
  push(100, { first: true, segmentStart: true });
  player.receive({ type: 'drain' });
  assert.equal(render().filter((x) => x !== 0).length, 100);
  push(256, { first: true, segmentStart: true }); // the next utterance
  assert.equal(player.underruns, 0);
});

test('clear fades out within fadeSamples and drops the rest', () => {
  push(1024, { first: true, segmentStart: true });
  render(2);
  const before = player.played;
  player.receive({ type: 'clear' });
  assert.deepEqual(posted('cleared'), [{ type: 'cleared', played: before }]);
  const out = render(4);
  assert.equal(player.played - before, 64);
  assert.ok(out[0] > 0 && out[0] <= 0.5 && out[63] === 0, 'a ramp down to silence');
  assert.equal(out.slice(64).filter((x) => x !== 0).length, 0);
  assert.equal(player.buffered, 0);
});

test('stats are posted while something changes', () => {
  push(1024, { first: true, segmentStart: true });
  render(16);
  assert.deepEqual(posted('stats').at(-1), { type: 'stats', played: 1024, buffered: 0, received: 1024, underruns: 0 });
});

test('the player\'s built-in worklet is worklet.js as it is now (else: npm run build-worklet)', () => {
  const source = readFileSync(SOURCE, 'utf8');
  assert.equal(WORKLET_SOURCE, source);
  assert.equal(readFileSync(TARGET, 'utf8'), inlineWorklet(source));
});
