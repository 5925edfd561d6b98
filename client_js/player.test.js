// The player's bookkeeping on the main thread, run outside a browser: player.js against a stand-in worklet node.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Player } from './player.js';

/** A PCM frame of `count` samples of 0.25 (float32 little-endian). */
function pcmFrame(count, sequence = 0) {
  const bytes = new Uint8Array(count * 4);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < count; i++) view.setFloat32(i * 4, 0.25, true);
  return { format: 'pcm_f32le', utterance: 0, sequence, packets: [bytes] };
}

function player() {
  const port = { posted: [], onmessage: null, postMessage(message) { this.posted.push(message); } };
  const stats = { packetsDecoded: 0, samplesPlayed: 0, bufferedSamples: 0, underruns: 0, playedAtCancel: null };
  const made = new Player(/** @type {any} */ ({ sampleRate: 24000 }), /** @type {any} */ ({ port }), /** @type {any} */ ({}), 'pcm_f32le', 0, stats);
  const report = (stats) => port.onmessage({ data: { type: 'stats', underruns: 0, ...stats } });
  return { made, port, stats, report };
}

test('audio posted to the worklet counts as buffered until the worklet reports it played', () => {
  const { made, port, stats, report } = player();
  made.play(pcmFrame(480), { segmentStart: true });
  assert.equal(port.posted.filter((message) => message.type === 'push').length, 1);
  assert.equal(stats.bufferedSamples, 480, 'queued as soon as it is posted');
  // A report the worklet sent before the push reached it: the buffer looked empty, but 480 samples are on their way.
  report({ played: 0, buffered: 0, received: 0 });
  assert.equal(stats.bufferedSamples, 480);
  made.play(pcmFrame(240, 1), { segmentStart: false });
  report({ played: 100, buffered: 380, received: 480 });
  assert.equal(stats.bufferedSamples, 380 + 240);
  report({ played: 720, buffered: 0, received: 720 });
  assert.equal(stats.bufferedSamples, 0);
  assert.equal(stats.samplesPlayed, 720);
});
