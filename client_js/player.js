/**
 * Turns audio frames into sound: Opus packets through WebCodecs `AudioDecoder` (one decoder per
 * utterance, as each utterance is its own Opus stream with its own pre-skip), PCM as is, and the
 * samples into the `worklet.js` jitter buffer. An `AnalyserNode` after it feeds level meters.
 *
 * @module player
 */

import { WORKLET_SOURCE } from './worklet_source.js';

/** @typedef {import('./protocol.js').AudioFrame} AudioFrame */

/** WebCodecs' Opus decoder outputs 48 kHz whatever the encoder's input rate was. */
export const OPUS_RATE = 48_000;
/** Each Opus packet from the server holds one 20 ms frame; chunk timestamps count in these. */
const PACKET_US = 20_000;
const OPUS_CONFIG = { codec: 'opus', sampleRate: OPUS_RATE, numberOfChannels: 1 };

/**
 * Whether this browser can decode Opus with WebCodecs (otherwise ask the server for PCM).
 * @returns {Promise<boolean>}
 */
export async function supportsOpus() {
  if (typeof AudioDecoder === 'undefined') return false;
  try {
    return (await AudioDecoder.isConfigSupported(OPUS_CONFIG)).supported === true;
  } catch {
    return false;
  }
}

/**
 * Counters the player keeps up to date (the client's `stats` object is passed in and written to).
 * @typedef {object} PlayerStats
 * @property {number} packetsDecoded Opus packets WebCodecs turned into audio
 * @property {number} samplesPlayed samples the worklet has output (silence excluded)
 * @property {number} bufferedSamples samples queued and not played yet: in the jitter buffer, or posted to the worklet
 *   and not arrived there yet (so it never reads 0 while decoded audio is on its way to the audio thread)
 * @property {number} underruns times the buffer ran dry mid-sentence
 * @property {number | null} playedAtCancel `samplesPlayed` when the last cancel reached the worklet
 */

/**
 * Per-utterance decoding state.
 * @typedef {object} Stream
 * @property {AudioDecoder | null} decoder null for PCM
 * @property {number} skip samples still to drop from the start (Opus pre-skip)
 * @property {number} packets packets fed so far (the next chunk's timestamp)
 * @property {Map<number, {first: boolean, segmentStart: boolean}>} marks flags of a frame's first packet, by timestamp
 * @property {{first: boolean, segmentStart: boolean}} carry flags of outputs trimmed away entirely
 */

export class Player extends EventTarget {
  /** Samples posted to the worklet so far; those it has not reported as received are still on their way. */
  #posted = 0;

  /**
   * Build a player; call it from a user gesture (or `resume()` from one later) so audio may start.
   * @param {object} options
   * @param {string} options.format the session's frame format (`opus`, `pcm_f32le`, `pcm_s16le`)
   * @param {number} options.sampleRate the audio's rate (`ready.sample_rate`; 48 kHz for Opus)
   * @param {number} options.leadSeconds audio buffered before playback starts
   * @param {number} options.preSkip Opus: 48 kHz samples to drop at each utterance's start
   * @param {PlayerStats} options.stats counters to update
   * @param {number} [options.fadeSeconds] fade-out on `clear()` (avoids a click)
   * @param {string | URL} [options.workletUrl] where to load worklet.js from; default: its built-in copy, as a Blob URL
   * @returns {Promise<Player>}
   */
  static async create({ format, sampleRate, leadSeconds, preSkip, stats, fadeSeconds = 0.005, workletUrl }) {
    if (!['opus', 'pcm_f32le', 'pcm_s16le'].includes(format)) {
      throw new RangeError(`the browser player cannot play ${format}`);
    }
    const rate = format === 'opus' ? OPUS_RATE : sampleRate;
    const context = new AudioContext({ sampleRate: rate, latencyHint: 'interactive' });
    await loadWorklet(context, workletUrl);
    const node = new AudioWorkletNode(context, 'voxwire-player', {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: {
        leadSamples: Math.round(leadSeconds * rate),
        fadeSamples: Math.round(fadeSeconds * rate),
      },
    });
    const analyser = new AnalyserNode(context, { fftSize: 2048 });
    node.connect(analyser).connect(context.destination);
    return new Player(context, node, analyser, format, preSkip, stats);
  }

  /**
   * @param {AudioContext} context
   * @param {AudioWorkletNode} node
   * @param {AnalyserNode} analyser
   * @param {string} format
   * @param {number} preSkip
   * @param {PlayerStats} stats
   */
  constructor(context, node, analyser, format, preSkip, stats) {
    super();
    this.context = context;
    this.analyser = analyser;
    this.format = format;
    this.preSkip = preSkip;
    this.stats = stats;
    this.node = node;
    /** @type {Map<number, Stream>} */
    this.streams = new Map();
    node.port.onmessage = (event) => this.#fromWorklet(event.data);
  }

  get sampleRate() {
    return this.context.sampleRate;
  }

  /** Let audio out; browsers keep a context suspended until a user gesture calls this. */
  resume() {
    if (this.context.state === 'suspended') this.context.resume();
  }

  /**
   * Decode a frame and queue its audio.
   * @param {AudioFrame} frame
   * @param {{segmentStart: boolean}} flags whether the frame starts a sentence (a `segment` came before it)
   */
  play(frame, { segmentStart }) {
    let stream = this.streams.get(frame.utterance);
    const first = stream === undefined;
    if (stream === undefined) {
      stream = this.#openStream(frame.utterance);
      this.streams.set(frame.utterance, stream);
    }
    const marks = { first, segmentStart };
    if (stream.decoder === null) {
      this.#push(frame.utterance, pcmSamples(frame.format, frame.packets[0]), marks);
      return;
    }
    frame.packets.forEach((packet, i) => {
      const timestamp = stream.packets++ * PACKET_US;
      if (i === 0) stream.marks.set(timestamp, marks);
      stream.decoder.decode(new EncodedAudioChunk({ type: 'key', timestamp, data: packet }));
    });
  }

  /**
   * The utterance is done: decode what is left, then, if `idle` (nothing else is coming), let the
   * buffer play out below the lead without calling the end an underrun.
   * @param {number} utterance
   * @param {boolean} idle
   */
  async finish(utterance, idle) {
    const stream = this.streams.get(utterance);
    if (stream?.decoder) {
      await stream.decoder.flush().catch(() => {}); // a cancel closes it meanwhile: nothing to flush
      if (stream.decoder.state !== 'closed') stream.decoder.close();
    }
    this.streams.delete(utterance);
    if (idle && this.streams.size === 0) this.node.port.postMessage({ type: 'drain' });
  }

  /** Barge-in: stop decoding everything in flight and silence the output after a few ms of fade. */
  clear() {
    for (const stream of this.streams.values()) {
      if (stream.decoder && stream.decoder.state !== 'closed') stream.decoder.close();
    }
    this.streams.clear();
    this.node.port.postMessage({ type: 'clear' });
  }

  async close() {
    this.clear();
    await this.context.close();
  }

  /** @param {number} utterance */
  #openStream(utterance) {
    /** @type {Stream} */
    const stream = {
      decoder: null,
      skip: this.format === 'opus' ? this.preSkip : 0,
      packets: 0,
      marks: new Map(),
      carry: { first: false, segmentStart: false },
    };
    if (this.format === 'opus') {
      stream.decoder = new AudioDecoder({
        output: (data) => this.#decoded(utterance, stream, data),
        error: (error) => this.dispatchEvent(new CustomEvent('error', { detail: error })),
      });
      stream.decoder.configure(OPUS_CONFIG);
    }
    return stream;
  }

  /**
   * @param {number} utterance
   * @param {Stream} stream
   * @param {AudioData} data
   */
  #decoded(utterance, stream, data) {
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: 'f32-planar' });
    const rate = data.sampleRate;
    const mark = stream.marks.get(data.timestamp);
    stream.marks.delete(data.timestamp);
    data.close();
    if (rate !== this.sampleRate) {
      this.dispatchEvent(new CustomEvent('error', { detail: new Error(`the decoder output ${rate} Hz, not ${this.sampleRate}`) }));
      return;
    }
    this.stats.packetsDecoded += 1;
    const skipped = Math.min(stream.skip, samples.length);
    stream.skip -= skipped;
    const marks = {
      first: stream.carry.first || (mark?.first ?? false),
      segmentStart: stream.carry.segmentStart || (mark?.segmentStart ?? false),
    };
    if (skipped === samples.length) {
      stream.carry = marks; // the pre-skip swallowed this packet: its flags go with the next one
      return;
    }
    stream.carry = { first: false, segmentStart: false };
    this.#push(utterance, samples.subarray(skipped), marks);
  }

  /**
   * @param {number} utterance
   * @param {Float32Array} samples
   * @param {{first: boolean, segmentStart: boolean}} marks
   */
  #push(utterance, samples, marks) {
    if (marks.first) this.dispatchEvent(new CustomEvent('decoded', { detail: { utterance } }));
    const own = samples.byteOffset === 0 && samples.length === samples.buffer.byteLength / 4 ? samples : samples.slice();
    this.#posted += own.length;
    this.stats.bufferedSamples += own.length;
    this.node.port.postMessage({ type: 'push', samples: own, utterance, ...marks }, [own.buffer]);
  }

  /**
   * @param {{type: string, utterance?: number, played?: number, buffered?: number, received?: number,
   *   underruns?: number}} message
   */
  #fromWorklet(message) {
    switch (message.type) {
      case 'stats':
        this.stats.samplesPlayed = message.played;
        this.stats.bufferedSamples = message.buffered + (this.#posted - message.received);
        this.stats.underruns = message.underruns;
        break;
      case 'cleared':
        this.stats.playedAtCancel = message.played;
        break;
      case 'playing':
      case 'underrun':
        this.dispatchEvent(new CustomEvent(message.type, { detail: { utterance: message.utterance } }));
        break;
    }
  }
}

/**
 * Add the jitter buffer's module to the audio context: from `url`, or from the source built into this module (a
 * Blob URL, which works wherever the library is bundled, with no file to copy).
 * @param {AudioContext} context
 * @param {string | URL | undefined} url
 */
export async function loadWorklet(context, url) {
  const builtIn = url === undefined;
  const tried = builtIn ? URL.createObjectURL(new Blob([WORKLET_SOURCE], { type: 'text/javascript' })) : String(url);
  try {
    await context.audioWorklet.addModule(tried);
  } catch (error) {
    await context.close();
    const advice = builtIn
      ? "the page's Content-Security-Policy must allow blob: scripts (script-src), or serve voxwire-client's " +
        'worklet.js yourself and pass its URL as the `workletUrl` option'
      : 'serve voxwire-client\'s worklet.js at that URL (a bundler: import its URL, e.g. Vite\'s ' +
        "`import workletUrl from 'voxwire-client/worklet.js?url'`), or leave `workletUrl` out to use the built-in copy";
    throw new Error(`the audio player's AudioWorklet module did not load from ${tried} (${error}): ${advice}`, {
      cause: error,
    });
  } finally {
    if (builtIn) URL.revokeObjectURL(tried);
  }
}

/**
 * A PCM payload as float samples (copied: the worklet takes ownership of the buffer).
 * @param {string} format `pcm_f32le` or `pcm_s16le`
 * @param {Uint8Array} bytes
 * @returns {Float32Array}
 */
export function pcmSamples(format, bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (format === 'pcm_f32le') {
    const samples = new Float32Array(bytes.byteLength >> 2);
    for (let i = 0; i < samples.length; i++) samples[i] = view.getFloat32(i * 4, true);
    return samples;
  }
  const samples = new Float32Array(bytes.byteLength >> 1);
  for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(i * 2, true) / 32768;
  return samples;
}
