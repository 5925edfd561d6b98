// The JavaScript protocol module against the server's golden vectors: every vector, both directions.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import {
  FRAME_FORMATS,
  FRAME_VERSION,
  PROTOCOL_VERSION,
  ProtocolError,
  audioFrameOf,
  audioMessageOf,
  decodeClient,
  decodeFrame,
  decodeServer,
  encodeClient,
  encodeFrame,
  encodeServer,
} from './protocol.js';

const vectors = JSON.parse(readFileSync(new URL('../tests/fixtures/protocol_vectors.json', import.meta.url), 'utf8'));

const fromHex = (hex) => Uint8Array.from(hex.match(/../g) ?? [], (byte) => parseInt(byte, 16));
const toHex = (bytes) => Buffer.from(bytes).toString('hex');

/** JSON texts are compared by value (Python writes 2.0 where JavaScript writes 2) and by key order. */
function assertSameJson(actual, expected) {
  const [a, b] = [JSON.parse(actual), JSON.parse(expected)];
  assert.deepEqual(a, b);
  assert.deepEqual(Object.keys(a), Object.keys(b));
}

const rejects = (code) => (error) => error instanceof ProtocolError && error.code === code;

test('versions match the vectors', () => {
  assert.equal(PROTOCOL_VERSION, vectors.protocol);
  assert.equal(FRAME_VERSION, vectors.frame_version);
});

for (const vector of vectors.client_messages) {
  test(`client message: ${vector.name}`, () => {
    const message = decodeClient(vector.input ?? vector.text);
    assertSameJson(encodeClient(message), vector.text);
    // What the client library sends is byte for byte what the server's encoder writes (no floats here).
    assert.equal(encodeClient(JSON.parse(vector.text)), vector.text);
  });
}

for (const vector of vectors.server_messages) {
  test(`server message: ${vector.name}`, () => {
    const message = decodeServer(vector.input ?? vector.text);
    assertSameJson(encodeServer(message), vector.text);
    assert.deepEqual(message, JSON.parse(vector.text));
    if (message.type === 'audio') assert.deepEqual(audioMessageOf(audioFrameOf(message)), message);
  });
}

for (const vector of vectors.client_errors) {
  test(`client error: ${vector.name} -> ${vector.code}`, () => {
    assert.throws(() => decodeClient(vector.text), rejects(vector.code));
    // The encoder refuses the same message before it reaches the wire (when it parses at all).
    let parsed;
    try {
      parsed = JSON.parse(vector.text);
    } catch {
      return;
    }
    assert.throws(() => encodeClient(parsed), ProtocolError);
  });
}

for (const vector of vectors.audio_frames) {
  test(`audio frame: ${vector.name}`, () => {
    const frame = decodeFrame(fromHex(vector.hex));
    const { format, utterance, sequence, packets, context_id: contextId = null } = vector.frame;
    assert.deepEqual(
      { format: frame.format, utterance: frame.utterance, sequence: frame.sequence, context_id: frame.context_id },
      { format, utterance, sequence, context_id: contextId },
    );
    assert.deepEqual(frame.packets.map(toHex), packets);
    if (!vector.decode_only) {
      const encoded = encodeFrame({ format, utterance, sequence, packets: packets.map(fromHex), context_id: contextId });
      assert.equal(toHex(encoded), vector.hex);
    }
    // The same frame as an `audio` JSON message decodes to the same audio.
    const again = audioFrameOf(decodeServer(JSON.stringify(audioMessageOf(frame))));
    assert.deepEqual([again.context_id, again.packets.map(toHex)], [contextId, packets]);
  });
}

for (const vector of vectors.bad_frames) {
  test(`bad frame: ${vector.name} -> ${vector.code}`, () => {
    assert.throws(() => decodeFrame(fromHex(vector.hex)), rejects(vector.code));
  });
}

test('frames decode from an ArrayBuffer and from a view at an offset', () => {
  const bytes = fromHex(vectors.audio_frames[0].hex);
  const shifted = new Uint8Array(bytes.length + 3);
  shifted.set(bytes, 3);
  for (const data of [bytes.buffer, shifted.subarray(3)]) {
    assert.deepEqual(decodeFrame(data).packets.map(toHex), vectors.audio_frames[0].frame.packets);
  }
});

test('server messages missing an optional field decode with it null, but a default context stays absent', () => {
  const error = decodeServer('{"type":"error","code":"busy","message":"full","context_id":null}');
  assert.equal(error.utterance, null);
  assert.equal('context_id' in error, false);
});

test('every format and message type has a vector', () => {
  assert.deepEqual(new Set(vectors.audio_frames.map((vector) => vector.frame.format)), new Set(FRAME_FORMATS));
  const types = (section) => new Set(vectors[section].map((vector) => JSON.parse(vector.text).type));
  assert.deepEqual(types('client_messages'), new Set(['start', 'text', 'flush', 'end', 'cancel', 'close_context']));
  assert.deepEqual(types('server_messages'), new Set(['ready', 'segment', 'words', 'done', 'error', 'audio']));
});

test('an audio message whose audio is not base64 is a bad frame', () => {
  const message = { type: 'audio', format: 'pcm_mulaw', utterance: 0, sequence: 0, audio: 'not base64!' };
  assert.throws(() => audioFrameOf(decodeServer(JSON.stringify(message))), rejects('bad_frame'));
});

test('the encoder omits unset fields and refuses unknown types', () => {
  assert.equal(encodeClient({ type: 'start', voice: undefined, seed: 7 }), '{"type":"start","seed":7}');
  assert.throws(() => encodeClient({ type: 'speak' }), rejects('unknown_type'));
  assert.throws(() => encodeClient({ type: 'text', text: 42 }), rejects('invalid_field'));
});

test('a words message needs one start and one end per word, each end at or after its start', () => {
  const words = (fields) => JSON.stringify({ type: 'words', utterance: 0, index: 0, ...fields });
  const ok = { words: ['Hi', 'there.'], starts_s: [0.1, 0.3], ends_s: [0.3, 0.7] };
  assert.deepEqual(decodeServer(words(ok)).words, ['Hi', 'there.']);
  assert.throws(() => decodeServer(words({ ...ok, ends_s: [0.3] })), rejects('invalid_field'));
  assert.throws(() => decodeServer(words({ ...ok, words: 'Hi there.' })), rejects('invalid_field'));
  assert.throws(() => decodeServer(words({ ...ok, starts_s: [0.1, '0.3'] })), rejects('invalid_field'));
  assert.throws(() => decodeServer(words({ ...ok, starts_s: [0.4, 0.3] })), rejects('out_of_range'));
});
