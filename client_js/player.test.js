// The player's bookkeeping on the main thread, run outside a browser: player.js against a stand-in worklet node.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Player, loadWorklet } from './player.js';

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

/** An audio context whose worklet refuses every module, as Chromium does a URL that does not load. */
function refusingContext() {
  const context = {
    tried: /** @type {string[]} */ ([]),
    closed: false,
    audioWorklet: {
      async addModule(/** @type {string} */ url) {
        context.tried.push(url);
        throw new DOMException("Unable to load a worklet's module.", 'AbortError');
      },
    },
    async close() {
      context.closed = true;
    },
  };
  return context;
}

test('a worklet that does not load is an error that names the URL tried and the option to set', async () => {
  const context = refusingContext();
  await assert.rejects(loadWorklet(/** @type {any} */ (context), 'https://app.example/assets/worklet.js'), (error) => {
    assert.match(error.message, /did not load from https:\/\/app\.example\/assets\/worklet\.js \(AbortError/);
    assert.match(error.message, /serve voxwire-client's worklet\.js at that URL/);
    return true;
  });
  assert.ok(context.closed, 'the audio context is not left open');
});

test('by default the worklet loads from its built-in source as a Blob URL, named when it fails', async () => {
  const context = refusingContext();
  await assert.rejects(loadWorklet(/** @type {any} */ (context), undefined), (error) => {
    assert.match(error.message, /did not load from blob:/);
    assert.match(error.message, /Content-Security-Policy must allow blob: scripts.*`workletUrl` option/);
    return true;
  });
  const [url] = context.tried;
  const blob = await fetch(url).then((response) => response.text(), () => null); // revoked after the attempt
  assert.equal(blob, null);
});
