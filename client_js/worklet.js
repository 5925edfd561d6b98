/**
 * The audio-thread half of the player: a jitter buffer of decoded mono samples.
 *
 * Playback starts once `leadSamples` are buffered (or when the stream says no more is coming), so
 * small gaps between network frames are absorbed. If the buffer runs dry while more audio of the
 * same sentence is still due, that is an underrun: it is counted, reported, and playback waits for
 * the lead again. Running dry between sentences is not counted: the next sentence may simply not
 * have been written yet (a language model still typing).
 *
 * Messages in (`port`): `push` {samples, utterance, first, segmentStart}, `drain` (no more audio
 * for now: play what is buffered), `clear` (barge-in: a short fade, then silence).
 * Messages out: `playing` {utterance} when an utterance's first sample plays, `underrun`
 * {utterance}, `cleared` {played} (the count when the clear arrived), `stats` {played, buffered,
 * received, underruns} every few render quanta while anything changes (`received`: every sample pushed so far,
 * so the main thread can tell what it posted that has not arrived yet).
 */

const STATS_EVERY_QUANTA = 16; // ~43 ms at 48 kHz: often enough for a level display and tests

/** @typedef {{samples: Float32Array, offset: number, utterance: number, first: boolean}} Chunk */

class PlayerProcessor extends AudioWorkletProcessor {
  /** @param {{processorOptions: {leadSamples: number, fadeSamples: number}}} options */
  constructor(options) {
    super();
    this.leadSamples = options.processorOptions.leadSamples;
    this.fadeSamples = options.processorOptions.fadeSamples;
    /** @type {Chunk[]} */
    this.queue = [];
    this.buffered = 0;
    this.playing = false;
    /** The buffer ran dry mid-stream; the next push decides whether that was an underrun. */
    this.dry = false;
    this.draining = false;
    /** The faded-out remainder after a clear, played before anything else. */
    this.tail = new Float32Array(0);
    this.tailOffset = 0;
    this.played = 0;
    this.received = 0;
    this.underruns = 0;
    this.quanta = 0;
    this.reported = '';
    this.port.onmessage = (event) => this.receive(event.data);
  }

  /** @param {{type: string, samples?: Float32Array, utterance?: number, first?: boolean, segmentStart?: boolean}} message */
  receive(message) {
    switch (message.type) {
      case 'push':
        if (this.dry && !message.segmentStart) {
          this.underruns += 1;
          this.port.postMessage({ type: 'underrun', utterance: message.utterance });
        }
        this.dry = false;
        this.draining = false;
        this.queue.push({ samples: message.samples, offset: 0, utterance: message.utterance, first: message.first });
        this.buffered += message.samples.length;
        this.received += message.samples.length;
        break;
      case 'drain':
        this.draining = true;
        this.dry = false;
        break;
      case 'clear':
        this.port.postMessage({ type: 'cleared', played: this.played });
        this.clear();
        break;
    }
  }

  /** Keep a short faded copy of what was about to play (no click), drop the rest. */
  clear() {
    const tail = new Float32Array(this.playing ? Math.min(this.fadeSamples, this.buffered) : 0);
    this.read(tail, 0, tail.length);
    for (let i = 0; i < tail.length; i++) tail[i] *= 1 - (i + 1) / tail.length;
    this.tail = tail;
    this.tailOffset = 0;
    this.queue = [];
    this.buffered = 0;
    this.playing = false;
    this.dry = false;
  }

  /**
   * Move up to `count` queued samples into `out` at `start`; returns how many were moved.
   * @param {Float32Array} out
   * @param {number} start
   * @param {number} count
   */
  read(out, start, count) {
    let written = 0;
    while (written < count && this.queue.length > 0) {
      const chunk = this.queue[0];
      if (chunk.first && chunk.offset === 0) this.port.postMessage({ type: 'playing', utterance: chunk.utterance });
      const n = Math.min(count - written, chunk.samples.length - chunk.offset);
      out.set(chunk.samples.subarray(chunk.offset, chunk.offset + n), start + written);
      chunk.offset += n;
      written += n;
      if (chunk.offset === chunk.samples.length) this.queue.shift();
    }
    this.buffered -= written;
    return written;
  }

  /**
   * @param {Float32Array[][]} _inputs
   * @param {Float32Array[][]} outputs
   */
  process(_inputs, outputs) {
    const out = outputs[0][0];
    let written = 0;
    if (this.tailOffset < this.tail.length) {
      written = Math.min(out.length, this.tail.length - this.tailOffset);
      out.set(this.tail.subarray(this.tailOffset, this.tailOffset + written));
      this.tailOffset += written;
    }
    if (!this.playing && this.buffered > 0 && (this.buffered >= this.leadSamples || this.draining)) {
      this.playing = true;
    }
    if (this.playing) {
      written += this.read(out, written, out.length - written);
      if (this.buffered === 0) {
        this.playing = false;
        this.dry = !this.draining;
      }
    }
    out.fill(0, written);
    this.played += written;
    this.report();
    return true; // keep the node alive between utterances
  }

  report() {
    this.quanta += 1;
    if (this.quanta % STATS_EVERY_QUANTA !== 0) return;
    const stats = {
      type: 'stats', played: this.played, buffered: this.buffered, received: this.received, underruns: this.underruns,
    };
    const key = `${stats.played}/${stats.buffered}/${stats.received}/${stats.underruns}`;
    if (key === this.reported) return;
    this.reported = key;
    this.port.postMessage(stats);
  }
}

registerProcessor('voxwire-player', PlayerProcessor);
