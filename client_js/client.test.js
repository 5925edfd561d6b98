// The client's recovery, run outside a browser: a scripted WebSocket stand-in and a player that records what
// it was given. A refused connection is retried with backoff; a lost session is reported, reconnected, and the
// next utterance is spoken on the new connection without anything played twice.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Player } from './player.js';
import { audioMessageOf, encodeFrame, encodeServer } from './protocol.js';
import { DEFAULT_RETRY, RefusedError, backoffMs, isLoss, isRefusal, withRetry } from './reconnect.js';

const READY = {
  type: 'ready', protocol: 1, model: 'fake', format: 'pcm_s16le', sample_rate: 16000, chunk_s: 0.16, pre_skip: 0,
  voice: null, seed: null, cfg_value: 2, inference_timesteps: 10, max_buffer_delay_ms: 500,
  playback_lead_ms: 300,
  persona: null,
};
const FAST = { retries: 3, firstDelayMs: 1, maxDelayMs: 2, jitter: 0.5 };

/** A WebSocket stand-in: each new socket takes the next behaviour of `FakeSocket.plan`. */
class FakeSocket {
  static OPEN = 1;
  /** @type {FakeSocket[]} */
  static all = [];
  /** @type {((socket: FakeSocket) => void)[]} what each new socket does once created */
  static plan = [];

  constructor(url) {
    this.url = url;
    this.readyState = 0;
    /** @type {any[]} */
    this.sent = [];
    FakeSocket.all.push(this);
    const behaviour = FakeSocket.plan.shift() ?? accept;
    setTimeout(() => behaviour(this), 0);
  }

  open() {
    this.readyState = FakeSocket.OPEN;
    this.onopen?.({});
  }

  message(message) {
    this.onmessage?.({ data: encodeServer(message) });
  }

  frame(utterance, sequence, contextId = null) {
    const packets = [new Uint8Array([sequence, 0])];
    const bytes = encodeFrame({ format: 'pcm_s16le', utterance, sequence, packets, context_id: contextId });
    this.onmessage?.({ data: bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength) });
  }

  drop(code, reason = '') {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }

  send(data) {
    const message = JSON.parse(data);
    this.sent.push(message);
    if (message.type === 'start') this.message({ ...READY, context_id: message.context_id });
  }

  close(code = 1000) {
    this.drop(code);
  }
}

/** The normal server: open, greet. */
function accept(socket) {
  socket.open();
  socket.message(READY);
}

/** A refused upgrade as a browser sees it (a 503 before the 101): closed, never opened. */
function refuseUpgrade(socket) {
  socket.drop(1006);
}

/** An older server's refusal: opened, `error` busy, close 1013. */
function refuseBusy(socket) {
  socket.open();
  socket.message({ type: 'error', code: 'busy', message: 'the server has its maximum of 1 connections', utterance: null });
  socket.drop(1013, 'busy: the server has its maximum of 1 connections');
}

/** Records what the client asks its player to do. */
class FakePlayer extends EventTarget {
  constructor() {
    super();
    this.format = 'pcm_s16le';
    this.sampleRate = 16000;
    /** @type {{utterance: number, sequence: number}[]} */
    this.played = [];
    /** @type {number[]} */
    this.finished = [];
  }

  play(frame) {
    this.played.push({ utterance: frame.utterance, sequence: frame.sequence });
  }

  finish(utterance) {
    this.finished.push(utterance);
  }

  resume() {}
  clear() {}
  async close() {}
}

globalThis.WebSocket = /** @type {any} */ (FakeSocket);
Player.create = async () => /** @type {any} */ (new FakePlayer());
const { VoxwireClient } = await import('./client.js');

function fresh(plan, options = {}) {
  FakeSocket.all = [];
  FakeSocket.plan = plan;
  const client = new VoxwireClient({ url: 'ws://replica.test', format: 'pcm_s16le', retry: FAST, ...options });
  /** @type {Record<string, any[]>} */
  const events = { retry: [], interrupted: [], reconnect: [], error: [], close: [] };
  for (const name of Object.keys(events)) client.addEventListener(name, (event) => events[name].push(event.detail));
  return { client, events };
}

const until = async (condition) => {
  for (let i = 0; i < 200 && !condition(); i += 1) await new Promise((resolve) => setTimeout(resolve, 2));
  assert.ok(condition(), 'timed out');
};

test('backoff doubles up to the cap, stretched by jitter', () => {
  const policy = { retries: 5, firstDelayMs: 250, maxDelayMs: 8000, jitter: 0.5 };
  assert.deepEqual([0, 1, 2, 3, 4, 5, 6].map((retry) => backoffMs(retry, policy, () => 0)), [250, 500, 1000, 2000, 4000, 8000, 8000]);
  assert.equal(backoffMs(0, policy, () => 0.999999), 250 * 1.4999995);
  assert.equal(DEFAULT_RETRY.retries, 5);
});

test('refusals and losses are told apart by close code and error code', () => {
  assert.ok(isRefusal({ closeCode: 1006 }) && isRefusal({ closeCode: 1013 }) && isRefusal({ code: 'busy' }));
  assert.ok(!isRefusal({ closeCode: 4001 }) && !isRefusal({ code: 'unknown_voice' }));
  assert.ok(isLoss(1001) && isLoss(1006) && !isLoss(1000) && !isLoss(1013) && !isLoss(4002));
});

test('withRetry retries only refusals, then gives up with the attempts counted', async () => {
  let calls = 0;
  const refused = () => {
    calls += 1;
    return Promise.reject(new RefusedError('busy'));
  };
  await assert.rejects(withRetry(refused, { ...FAST, retries: 2 }, { sleep: async () => {} }), /gave up after 3 attempt/);
  assert.equal(calls, 3);
  await assert.rejects(withRetry(() => Promise.reject(new Error('bad key')), FAST, { sleep: async () => {} }), /bad key/);
});

test('connect() retries a refused upgrade and a 1013 refusal, then starts the session', async () => {
  const { client, events } = fresh([refuseUpgrade, refuseBusy, accept]);
  const ready = await client.connect();
  assert.equal(ready.model, 'fake');
  assert.equal(events.retry.length, 2);
  assert.deepEqual(events.retry.map((detail) => detail.retry), [1, 2]);
  assert.equal(FakeSocket.all.length, 3);
});

test('connect() gives up after its retries', async () => {
  const { client } = fresh([refuseUpgrade, refuseUpgrade, refuseUpgrade, refuseUpgrade, refuseUpgrade]);
  await assert.rejects(client.connect(), /gave up after 4 attempt/);
});

test('a session lost mid-utterance is reported, and the next utterance goes to a new connection', async () => {
  const { client, events } = fresh([accept, refuseUpgrade, accept]);
  await client.connect();
  const first = FakeSocket.all[0];
  client.text('One sentence. ');
  client.end();
  first.frame(0, 0);
  first.frame(0, 1);
  first.drop(1006); // the replica was killed: no done for utterance 0
  assert.deepEqual(events.close, [{ code: 1006, reason: '', reconnecting: true }]);
  assert.deepEqual(events.interrupted, [{ utterances: [0], code: 1006, reason: '' }]);
  client.text('The next one. '); // while reconnecting: it waits for the new connection
  client.end();
  await until(() => events.reconnect.length === 1);
  assert.equal(events.retry.length, 1); // the first new attempt was refused
  const second = FakeSocket.all[2];
  assert.deepEqual(second.sent.map((message) => message.type), ['start', 'text', 'end']);
  assert.equal(second.sent[1].text, 'The next one. ');
  second.frame(0, 0); // the server's utterance 0 on this connection is the client's utterance 1
  second.message({ type: 'done', utterance: 0, finish_reason: 'stop', audio_s: 0.16, ttfa_s: 0.1, segments: 1 });
  const player = /** @type {FakePlayer} */ (/** @type {unknown} */ (client.player));
  assert.deepEqual(player.played, [
    { utterance: 0, sequence: 0 },
    { utterance: 0, sequence: 1 },
    { utterance: 1, sequence: 0 },
  ]);
  assert.deepEqual(player.finished, [0, 1]);
  assert.equal(client.stats.utterancesDone, 2);
  assert.equal(first.sent.filter((message) => message.type === 'text').length, 1); // nothing sent twice
});

test('a close the client asked for, or reconnect: false, does not reconnect', async () => {
  const { client, events } = fresh([accept], { reconnect: false });
  await client.connect();
  client.text('Hello. ');
  FakeSocket.all[0].drop(1001, 'server shutting down');
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal(FakeSocket.all.length, 1);
  assert.equal(events.interrupted.length, 0);
  assert.equal(events.close[0].reconnecting, false);
  const closing = fresh([accept]);
  await closing.client.connect();
  await closing.client.close();
  await new Promise((resolve) => setTimeout(resolve, 10));
  assert.equal(FakeSocket.all.length, 1);
});

test('the client announces its playback lead in start, so the server schedules by it', async () => {
  const { client } = fresh([accept], { leadSeconds: 0.45 });
  await client.connect();
  assert.equal(FakeSocket.all[0].sent.find((message) => message.type === 'start').playback_lead_ms, 450);
  const plain = fresh([accept]).client;
  await plain.connect();
  assert.ok(!('playback_lead_ms' in FakeSocket.all[0].sent.find((message) => message.type === 'start')));
});

test('a context has its own settings, and its audio waits for the utterances opened before it', async () => {
  const { client } = fresh([accept]);
  await client.connect();
  const socket = FakeSocket.all[0];
  const next = client.context('turn-2');
  const ready = await next.configure({ voice: 'voice_b', seed: 3 });
  assert.equal(ready.context_id, 'turn-2');
  const start = socket.sent.at(-1);
  assert.deepEqual([start.context_id, start.voice, start.seed, start.format], ['turn-2', 'voice_b', 3, 'pcm_s16le']);
  client.text('This turn. ');
  client.end();
  next.text('The next turn, prefetched. ');
  next.end();
  assert.deepEqual(socket.sent.slice(-4).map((m) => [m.type, m.context_id]), [
    ['text', undefined], ['end', undefined], ['text', 'turn-2'], ['end', 'turn-2'],
  ]);
  socket.frame(1, 0, 'turn-2'); // the prefetched turn is ready first: it waits
  socket.frame(0, 0);
  const player = /** @type {FakePlayer} */ (/** @type {unknown} */ (client.player));
  assert.deepEqual(player.played, [{ utterance: 0, sequence: 0 }]);
  socket.message({ type: 'done', utterance: 0, finish_reason: 'stop', audio_s: 0.16, segments: 1 });
  socket.frame(1, 1, 'turn-2');
  socket.message({ type: 'done', utterance: 1, finish_reason: 'stop', audio_s: 0.32, segments: 1, context_id: 'turn-2' });
  assert.deepEqual(player.played, [
    { utterance: 0, sequence: 0 },
    { utterance: 1, sequence: 0 },
    { utterance: 1, sequence: 1 },
  ]);
  assert.deepEqual(player.finished, [0, 1]);
});

test('cancelling a context drops its audio only, and close_context forgets it', async () => {
  const { client } = fresh([accept]);
  await client.connect();
  const socket = FakeSocket.all[0];
  const other = client.context('b');
  client.text('Kept. ');
  other.text('Dropped. ');
  other.cancel();
  assert.deepEqual(socket.sent.at(-1), { type: 'cancel', context_id: 'b' });
  socket.frame(1, 0, 'b'); // already on the way when the cancel arrived
  socket.message({ type: 'done', utterance: 1, finish_reason: 'cancelled', audio_s: 0, segments: 0, context_id: 'b' });
  socket.frame(0, 0);
  client.end();
  socket.message({ type: 'done', utterance: 0, finish_reason: 'stop', audio_s: 0.16, segments: 1 });
  const player = /** @type {FakePlayer} */ (/** @type {unknown} */ (client.player));
  assert.deepEqual(player.played, [{ utterance: 0, sequence: 0 }]);
  assert.equal(client.stats.framesDropped, 1);
  other.close();
  assert.deepEqual(socket.sent.at(-1), { type: 'close_context', context_id: 'b' });
  assert.equal(client.contexts.has('b'), false);
});

test('audio sent as JSON messages (audio_transport json) plays like binary frames', async () => {
  const { client } = fresh([accept]);
  await client.connect();
  const socket = FakeSocket.all[0];
  client.text('Hello. ');
  const packets = [new Uint8Array([1, 0, 2, 0])];
  socket.message(audioMessageOf({ format: 'pcm_s16le', utterance: 0, sequence: 0, packets }));
  const player = /** @type {FakePlayer} */ (/** @type {unknown} */ (client.player));
  assert.deepEqual(player.played, [{ utterance: 0, sequence: 0 }]);
});

test('the WebSocket option is the implementation used; without one or a global, connect says what to pass', async () => {
  class OwnSocket extends FakeSocket {}
  const { client } = fresh([], { WebSocket: OwnSocket });
  await client.connect();
  assert.ok(FakeSocket.all[0] instanceof OwnSocket);
  client.text('Hello. ');
  assert.deepEqual(FakeSocket.all[0].sent.map((message) => message.type), ['start', 'text']);
  await client.close();

  const global = globalThis.WebSocket;
  delete globalThis.WebSocket; // Node before 22
  try {
    await assert.rejects(fresh([]).client.connect(), { name: 'TypeError', message: /no WebSocket.*`WebSocket` option.*ws/ });
  } finally {
    globalThis.WebSocket = global;
  }
});
