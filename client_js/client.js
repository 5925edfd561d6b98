/**
 * The public API: a streaming text-to-speech session with a voxwire server, played in the page.
 *
 * ```js
 * import { VoxwireClient } from '/client/client.js';
 * const tts = new VoxwireClient({ token, voice: 'default', leadSeconds: 0.2 });
 * tts.addEventListener('firstAudio', (e) => console.log(`first audio after ${e.detail.latencyMs} ms`));
 * await tts.connect();              // from a click handler: browsers start audio on a user gesture
 * tts.text('Hello there. ');        // as a language model streams it, word by word
 * tts.end();                        // the rest is spoken, then `done`
 * tts.cancel();                     // barge-in: silence now, late audio is dropped
 *
 * const next = tts.context('turn-2'); // another context on the same connection: its own settings and cancel
 * await next.configure({ voice: 'voice_0123456789abcdef' });
 * next.text('Prepared while the first turn plays. ');
 * next.end();                       // its audio plays after the utterances opened before it
 * ```
 *
 * Events are `CustomEvent`s with their payload in `detail`; `ClientEvents` below lists them.
 *
 * Recovery: `connect()` retries a refused connection (a busy, starting or draining server) with
 * backoff and jitter (`retry` option). A lost session reconnects on its own (`reconnect: false`
 * turns it off); `text()` and the rest wait for the new connection, and the next utterance is
 * spoken there. Utterance numbers are the client's: they keep counting across connections.
 *
 * Contexts: `context(id)` names one of the connection's contexts (the server speaks them side by side);
 * every method of the client also takes a context id (omitted: the default context). A context shares the
 * client's format and player; utterances play in the order they were opened, whatever their context, so a
 * context's audio that comes early waits for the utterances before it (an agent's next turn is prefetched).
 * `cancel(id)` stops that context only; `closeContext(id)` also forgets it on the server.
 *
 * @module client
 */

import { ProtocolError, audioFrameOf, decodeFrame, decodeServer, encodeClient } from './protocol.js';
import { Player, supportsOpus } from './player.js';
import { DEFAULT_RETRY, RefusedError, isLoss, isRefusal, withRetry } from './reconnect.js';

export { ProtocolError } from './protocol.js';
export { RefusedError } from './reconnect.js';
export { supportsOpus } from './player.js';

export const STREAM_PATH = '/v1/tts/stream';
/** `WebSocket.OPEN`, which the global `WebSocket` may not be there to tell (a `WebSocket` option in Node). */
const OPEN = 1;

/**
 * @typedef {object} ClientOptions
 * @property {string} [url] server (`http(s)://` or `ws(s)://` host, or the full endpoint URL); default: this page's server
 * @property {string} [token] API key, sent as the `token` query parameter (browsers cannot set WebSocket headers)
 * @property {'opus' | 'pcm_f32le' | 'pcm_s16le'} [format] `opus` (default) falls back to `pcm_f32le` without WebCodecs Opus
 * @property {string} [voice] a saved voice id, or `default`
 * @property {number} [seed] segment k of each utterance uses seed + k
 * @property {number} [cfgValue]
 * @property {number} [inferenceTimesteps]
 * @property {number} [maxBufferDelayMs] how long an incomplete sentence waits for more text
 * @property {boolean} [normalize] read numbers, dates and money as words (the server needs `voxwire[normalize]`)
 * @property {string} [persona] a LoRA persona loaded on the server (`GET /v1/loras`); default: the base model
 * @property {string} [instructions] VoxCPM2's voice design: a description of the voice, for every sentence
 * @property {number} [speed] speaking speed, 0.25 to 4.0, pitch kept (default 1.0)
 * @property {number} [leadSeconds] audio buffered before playback starts; default one model chunk (`ready.chunk_s`)
 * @property {Partial<import('./reconnect.js').RetryPolicy>} [retry] how a refused connection is retried
 * @property {boolean} [reconnect] open a new connection when the session is lost (default true)
 * @property {string | URL} [workletUrl] where the player loads its AudioWorklet module (voxwire-client's
 *   `worklet.js`) from; default: the copy built into the library, as a Blob URL (which a Content-Security-Policy
 *   without `blob:` scripts refuses)
 * @property {WebSocketClass} [WebSocket] the WebSocket implementation; default: the global `WebSocket`
 *   (pass e.g. the `ws` package's where there is none, as in Node before 22)
 */

/**
 * Live counters, updated in place (a page may expose the object itself, e.g. `window.voxwireStats`).
 * @typedef {import('./player.js').PlayerStats & {
 *   decoder: 'webcodecs' | 'pcm' | null,
 *   framesReceived: number,
 *   framesDropped: number,
 *   utterancesDone: number,
 *   firstAudio: FirstAudio | null,
 * }} ClientStats
 */

/**
 * Milliseconds from an utterance's first `text()` to its first sample played (`latencyMs`), to its first
 * frame received and to its first audio decoded (null when not seen, e.g. PCM is not decoded).
 * @typedef {{utterance: number, latencyMs: number, receivedMs: number | null, decodedMs: number | null}} FirstAudio
 */

/** @typedef {new (url: string) => WebSocket} WebSocketClass a WebSocket constructor, the browser's or a compatible one */

/** @typedef {{textAt: number, receivedAt: number | null, decodedAt: number | null}} Timing */

/**
 * A failure: the server's `error` message, or one of the client's own (`utterance` null), e.g. `decode_failed`,
 * `bad_frame`, or `reconnect_failed` when a lost session could not be resumed. Branch on `code`.
 * @typedef {{code: string, message: string, utterance: number | null}} ClientError
 */

/**
 * The events a client dispatches, by name, and the `detail` each carries.
 * @typedef {object} ClientEvents
 * @property {ReadyMessage} ready the settings in effect (after `connect()`, `configure()` and a reconnection)
 * @property {SegmentMessage} segment a sentence starts
 * @property {WordsMessage} words when some of a sentence's words are spoken (estimated from its audio, after its frames; a sentence's words may come in several parts, in order)
 * @property {FirstAudio} firstAudio an utterance's first sample played
 * @property {DoneMessage} done an utterance is finished (its audio may still be playing)
 * @property {{utterance: number}} underrun the buffer ran dry mid-sentence
 * @property {ClientError} error
 * @property {{code: number, reason: string, reconnecting: boolean}} close the connection closed
 * @property {{retry: number, delayMs: number, reason: string}} retry a refused connection is tried again
 * @property {{utterances: number[], code: number, reason: string}} interrupted the connection was lost (1001,
 *   1006) before these utterances were done; what was received still plays, the rest of them is skipped
 * @property {{}} reconnect a new connection took over; text sent meanwhile went to it
 */

/**
 * The settings a context may choose for itself; the format, lead and connection are the client's.
 * @typedef {Pick<ClientOptions, 'voice' | 'seed' | 'cfgValue' | 'inferenceTimesteps' | 'maxBufferDelayMs' |
 *   'normalize' | 'persona' | 'instructions' | 'speed'>} ContextOptions
 */

/**
 * Audio of an utterance that must wait for the utterances opened before it, and whether its `done` came.
 * @typedef {{frames: {frame: AudioFrame, segmentStart: boolean}[], done: boolean}} Held
 */

/**
 * A listener of one of the client's events.
 * @template {keyof ClientEvents} Name
 * @typedef {(this: VoxwireClient, event: CustomEvent<ClientEvents[Name]>) => void} ClientListener
 */

/**
 * @typedef {import('./protocol.js').ClientMessage} ClientMessage
 * @typedef {import('./protocol.js').AudioFrame} AudioFrame
 * @typedef {import('./protocol.js').ReadyMessage} ReadyMessage
 * @typedef {import('./protocol.js').SegmentMessage} SegmentMessage
 * @typedef {import('./protocol.js').WordsMessage} WordsMessage
 * @typedef {import('./protocol.js').DoneMessage} DoneMessage
 */

export class VoxwireClient extends EventTarget {
  /** @param {ClientOptions} [options] */
  constructor(options = {}) {
    super();
    /** @type {ClientOptions} the options in effect (`configure()` changes them) */
    this.options = { format: 'opus', ...options };
    /** @type {ClientStats} */
    this.stats = {
      decoder: null,
      framesReceived: 0,
      framesDropped: 0,
      packetsDecoded: 0,
      samplesPlayed: 0,
      bufferedSamples: 0,
      underruns: 0,
      utterancesDone: 0,
      playedAtCancel: null,
      firstAudio: null,
    };
    /** @type {ReadyMessage | null} the settings in effect */
    this.settings = null;
    /** @type {WebSocket | null} the current connection */
    this.socket = null;
    /** @type {Player | null} the current audio output */
    this.player = null;
    /** Number the server will give the next utterance (it counts them per connection, from 0). */
    this.nextUtterance = 0;
    /** @private @type {Map<string | null, number>} each context's utterance taking text (null: the default context) */
    this.openUtterances = new Map();
    /** @private @type {Map<number, string | null>} the context of each utterance not done yet */
    this.utteranceContexts = new Map();
    /** @private @type {Set<number>} utterances cancelled and not done yet: their frames are dropped on arrival */
    this.cancelled = new Set();
    /** @private The utterance whose audio goes to the player now; later ones wait in `held`. */
    this.head = 0;
    /** @private @type {Map<number, Held>} audio of utterances after `head`, in arrival order */
    this.held = new Map();
    /** @type {Map<string, ContextOptions>} the named contexts this client opened, with their settings */
    this.contexts = new Map();
    /** @private @type {Map<number, Timing>} utterances whose first audio has not played yet */
    this.timings = new Map();
    /** @private @type {Set<number>} utterances whose next frame starts a sentence (a `segment` came) */
    this.segmentStarts = new Set();
    /** @private @type {number | null} the player's lead, in seconds */
    this.lead = null;
    /** @private @type {{resolve: (ready: ReadyMessage) => void, reject: (error: Error) => void}[]} */
    this.readyWaiters = [];
    /** @private The client's number of the current connection's utterance 0 (the server counts per connection). */
    this.base = 0;
    /** @private @type {Promise<void> | null} a lost session's replacement, while it connects */
    this.reconnecting = null;
    /** @private @type {ClientMessage[]} messages sent while reconnecting, in order */
    this.queued = [];
    /** @private Set by `close()`: a close we asked for is not a loss. */
    this.closing = false;
  }

  /**
   * Listen to one of the client's events (`ClientEvents` says what each carries).
   * @template {keyof ClientEvents} Name
   * @overload
   * @param {Name} type
   * @param {ClientListener<Name>} listener
   * @param {boolean | AddEventListenerOptions} [options]
   * @returns {void}
   */
  /**
   * @overload
   * @param {string} type
   * @param {EventListenerOrEventListenerObject | null} listener
   * @param {boolean | AddEventListenerOptions} [options]
   * @returns {void}
   */
  /**
   * Typed for `ClientEvents`; otherwise `EventTarget`'s own.
   * @param {string} type
   * @param {any} listener
   * @param {boolean | AddEventListenerOptions} [options]
   */
  addEventListener(type, listener, options) {
    super.addEventListener(type, listener, options);
  }

  /**
   * @template {keyof ClientEvents} Name
   * @overload
   * @param {Name} type
   * @param {ClientListener<Name>} listener
   * @param {boolean | EventListenerOptions} [options]
   * @returns {void}
   */
  /**
   * @overload
   * @param {string} type
   * @param {EventListenerOrEventListenerObject | null} listener
   * @param {boolean | EventListenerOptions} [options]
   * @returns {void}
   */
  /**
   * Typed for `ClientEvents`; otherwise `EventTarget`'s own.
   * @param {string} type
   * @param {any} listener
   * @param {boolean | EventListenerOptions} [options]
   */
  removeEventListener(type, listener, options) {
    super.removeEventListener(type, listener, options);
  }

  /** Whether an utterance is not done yet or its audio is still playing (a `cancel()` would cut something). */
  get speaking() {
    return this.stats.utterancesDone < this.nextUtterance || this.stats.bufferedSamples > 0;
  }

  /**
   * Whether the context has an utterance taking text (an `end()` would close it).
   * @param {string} [contextId] omitted: the default context
   */
  isOpen(contextId) {
    return this.openUtterances.has(contextId ?? null);
  }

  /** The analyser after the player, for level meters and waveforms (null before `connect`). */
  get analyser() {
    return this.player?.analyser ?? null;
  }

  /**
   * Open the session and apply the options; resolves with the `ready` message in effect.
   * Call it from a user gesture so that the audio context may start.
   * @returns {Promise<ReadyMessage>}
   * @throws {RefusedError} when the server still refuses after the `retry` policy's attempts
   * @throws {ProtocolError} when the server refuses the settings (e.g. an unknown voice)
   */
  async connect() {
    this.closing = false;
    await this.#openWithRetry();
    return this.#apply({});
  }

  /**
   * Change settings between utterances (voice, format, seed, ...); resolves with the new `ready`. With a
   * `contextId`, the settings of that context only (made if new; format and lead stay the client's).
   * @param {ClientOptions} changes
   * @param {string} [contextId]
   * @returns {Promise<ReadyMessage>}
   * @throws {ProtocolError} when the server refuses the settings (or has `max_contexts` open: `too_many_contexts`)
   */
  async configure(changes, contextId) {
    await this.reconnecting;
    if (contextId === undefined) return this.#apply(changes);
    const options = { ...this.contexts.get(contextId), ...changes };
    const ready = await this.#startContext(contextId, options);
    this.contexts.set(contextId, options);
    return ready;
  }

  /**
   * A handle on one context of this connection: the client's methods with `contextId` filled in.
   * @param {string} contextId 1 to 64 UTF-8 bytes
   */
  context(contextId) {
    return new VoxwireContext(this, contextId);
  }

  /**
   * Start a named context with its own settings over the client's format and lead.
   * @param {string} contextId
   * @param {ContextOptions} options
   */
  async #startContext(contextId, options) {
    const ready = this.#nextReady();
    this.#write({ ...this.#startMessage({ ...this.options, ...options }, this.settings?.format), context_id: contextId });
    const settings = await ready;
    this.dispatchEvent(new CustomEvent('ready', { detail: settings }));
    return settings;
  }

  /**
   * The `start` message of `options`.
   * @param {ClientOptions} options
   * @param {string | undefined} format
   * @returns {import('./protocol.js').StartMessage}
   */
  #startMessage(options, format) {
    const { voice, seed, cfgValue, inferenceTimesteps, maxBufferDelayMs, normalize, leadSeconds, persona } = options;
    const { instructions, speed } = options;
    return {
      type: 'start',
      voice,
      format,
      seed,
      cfg_value: cfgValue,
      inference_timesteps: inferenceTimesteps,
      max_buffer_delay_ms: maxBufferDelayMs,
      normalize,
      // The server schedules this stream to stay ahead of the playback our lead implies.
      playback_lead_ms: leadSeconds == null ? undefined : Math.round(leadSeconds * 1000),
      persona,
      instructions,
      speed,
    };
  }

  /** @param {ClientOptions} changes */
  async #apply(changes) {
    Object.assign(this.options, changes);
    const format = this.options.format === 'opus' && !(await supportsOpus()) ? 'pcm_f32le' : this.options.format;
    const ready = this.#nextReady();
    this.#write(this.#startMessage(this.options, format));
    this.settings = await ready;
    await this.#ensurePlayer(this.settings);
    this.dispatchEvent(new CustomEvent('ready', { detail: this.settings }));
    return this.settings;
  }

  /**
   * Append text to the utterance (opening one if none is); send the spaces between words.
   * @param {string} text
   * @param {string} [contextId] the context (omitted: the default context)
   */
  text(text, contextId) {
    if (!text) return; // the server ignores empty text: it opens no utterance
    this.player?.resume();
    const context = contextId ?? null;
    if (!this.openUtterances.has(context)) {
      const utterance = this.nextUtterance++;
      this.openUtterances.set(context, utterance);
      this.utteranceContexts.set(utterance, context);
      this.timings.set(utterance, { textAt: performance.now(), receivedAt: null, decodedAt: null });
    }
    this.#send({ type: 'text', text, context_id: contextId });
  }

  /**
   * Speak what is buffered now, even an incomplete sentence; the utterance stays open.
   * @param {string} [contextId]
   */
  flush(contextId) {
    this.#send({ type: 'flush', context_id: contextId });
  }

  /**
   * Close the utterance: the rest of its text is spoken, then `done`.
   * @param {string} [contextId]
   */
  end(contextId) {
    this.#send({ type: 'end', context_id: contextId });
    this.openUtterances.delete(contextId ?? null);
  }

  /**
   * Barge-in: stop every utterance of the context, silence its playback at once, and drop its frames still on the
   * way; other contexts go on.
   * @param {string} [contextId]
   */
  cancel(contextId) {
    this.#send({ type: 'cancel', context_id: contextId });
    this.#drop(contextId ?? null);
  }

  /**
   * Cancel a named context and forget it on the server, freeing its slot (`max_contexts`).
   * @param {string} contextId
   */
  closeContext(contextId) {
    this.#send({ type: 'close_context', context_id: contextId });
    this.contexts.delete(contextId);
    this.#drop(contextId);
  }

  /**
   * The context's utterances are cancelled: their audio is dropped, from the player too if one is playing.
   * @param {string | null} context
   */
  #drop(context) {
    this.openUtterances.delete(context);
    for (const [utterance, owner] of this.utteranceContexts) {
      if (owner !== context) continue;
      this.cancelled.add(utterance);
      this.timings.delete(utterance);
      this.segmentStarts.delete(utterance);
      this.held.get(utterance)?.frames.splice(0);
      if (utterance === this.head) this.player?.clear();
    }
  }

  /** Close the connection and the audio context. */
  async close() {
    this.closing = true;
    this.socket?.close(1000);
    await this.player?.close();
    this.player = null;
  }

  /**
   * Send now, or after the reconnection in progress.
   * @param {ClientMessage} message
   */
  #send(message) {
    if (this.reconnecting) this.queued.push(message);
    else this.#write(message);
  }

  /** @param {ClientMessage} message */
  #write(message) {
    if (this.socket?.readyState !== OPEN) throw new Error('not connected: call connect() first');
    this.socket.send(encodeClient(message));
  }

  #openWithRetry() {
    const onRetry = (/** @type {any} */ detail) => this.dispatchEvent(new CustomEvent('retry', { detail }));
    return withRetry(() => this.#open(), { ...DEFAULT_RETRY, ...this.options.retry }, { onRetry });
  }

  /** Open a socket and wait for the server's greeting (its defaults); a refusal rejects with a `RefusedError`. */
  async #open() {
    const Socket = this.options.WebSocket ?? globalThis.WebSocket;
    if (Socket === undefined) {
      throw new TypeError(
        "this runtime has no WebSocket (Node before 22): pass one as the `WebSocket` option, e.g. the ws package's " +
          "(`import { WebSocket } from 'ws'`)",
      );
    }
    const socket = new Socket(streamUrl(this.options.url, this.options.token));
    socket.binaryType = 'arraybuffer';
    this.socket = socket;
    let opened = false;
    socket.onopen = () => {
      opened = true;
    };
    socket.onmessage = (event) => this.#receive(event.data);
    socket.onclose = (event) => this.#closed(socket, event, opened);
    try {
      await this.#nextReady();
    } catch (error) {
      if (isRefusal(/** @type {any} */ (error))) throw new RefusedError(error.message);
      throw error;
    }
  }

  /**
   * @param {WebSocket} socket
   * @param {CloseEvent} event
   * @param {boolean} opened
   */
  #closed(socket, event, opened) {
    socket.onmessage = null;
    const where = socket.url.replace(/token=[^&]*/, 'token=…');
    const text = opened ? `closed: ${event.code} ${event.reason}` : `cannot open ${where} (${event.code})`;
    const error = Object.assign(new Error(text), { closeCode: event.code });
    for (const waiter of this.readyWaiters.splice(0)) waiter.reject(error);
    const established = this.settings !== null && socket === this.socket && !this.reconnecting;
    const reconnecting = established && !this.closing && isLoss(event.code) && this.options.reconnect !== false;
    this.dispatchEvent(new CustomEvent('close', { detail: { code: event.code, reason: event.reason, reconnecting } }));
    if (!reconnecting) return;
    this.#interrupted(event);
    this.#reconnect();
  }

  /**
   * The utterances not done when the session was lost end here: what was received plays out, nothing is
   * asked again (so nothing is heard twice).
   * @param {CloseEvent} event
   */
  #interrupted(event) {
    const cut = [...this.utteranceContexts.keys()];
    this.openUtterances.clear();
    this.utteranceContexts.clear();
    this.cancelled.clear();
    this.stats.utterancesDone = this.nextUtterance;
    this.segmentStarts.clear();
    for (const utterance of cut) {
      this.timings.delete(utterance);
      for (const { frame, segmentStart } of this.held.get(utterance)?.frames ?? []) {
        this.player?.play(frame, { segmentStart });
      }
      this.player?.finish(utterance, utterance === this.nextUtterance - 1);
    }
    this.held.clear();
    this.head = this.nextUtterance;
    if (cut.length > 0) {
      const detail = { utterances: cut, code: event.code, reason: event.reason };
      this.dispatchEvent(new CustomEvent('interrupted', { detail }));
    }
  }

  /** A new connection with the same settings; messages sent meanwhile wait for it. */
  #reconnect() {
    this.base = this.nextUtterance;
    this.reconnecting = (async () => {
      try {
        await this.#openWithRetry();
        await this.#apply({});
        for (const [contextId, options] of this.contexts) await this.#startContext(contextId, options);
        for (const message of this.queued.splice(0)) this.#write(message);
        this.dispatchEvent(new CustomEvent('reconnect', { detail: {} }));
      } catch (error) {
        this.queued.length = 0;
        this.#fail('reconnect_failed', `the session was lost and could not be resumed: ${error.message}`);
      } finally {
        this.reconnecting = null;
      }
    })();
  }

  #nextReady() {
    return new Promise((resolve, reject) => this.readyWaiters.push({ resolve, reject }));
  }

  /** @param {ReadyMessage} ready */
  async #ensurePlayer(ready) {
    const rate = ready.format === 'opus' ? 48_000 : ready.sample_rate;
    const lead = this.options.leadSeconds ?? ready.chunk_s;
    const player = this.player;
    if (player && player.format === ready.format && player.sampleRate === rate && this.lead === lead) {
      player.preSkip = ready.pre_skip;
      return;
    }
    await player?.close();
    this.lead = lead;
    this.player = await Player.create({
      format: ready.format,
      sampleRate: ready.sample_rate,
      leadSeconds: lead,
      preSkip: ready.pre_skip,
      stats: this.stats,
      workletUrl: this.options.workletUrl,
    });
    this.stats.decoder = ready.format === 'opus' ? 'webcodecs' : 'pcm';
    this.player.addEventListener('decoded', (event) => this.#mark(event.detail.utterance, 'decodedAt'));
    this.player.addEventListener('playing', (event) => this.#firstAudio(event.detail.utterance));
    this.player.addEventListener('underrun', (event) => this.dispatchEvent(new CustomEvent('underrun', { detail: event.detail })));
    this.player.addEventListener('error', (event) => this.#fail('decode_failed', String(event.detail)));
  }

  /** @param {string | ArrayBuffer} data */
  #receive(data) {
    let message;
    try {
      if (typeof data !== 'string') {
        this.#audio(decodeFrame(data));
        return;
      }
      message = decodeServer(data);
      if (message.type === 'audio') {
        this.#audio(audioFrameOf(message)); // `audio_transport: json`: the same frame, as text
        return;
      }
    } catch (error) {
      this.#fail(error.code, error.message);
      return;
    }
    if (typeof message.utterance === 'number') message = { ...message, utterance: this.base + message.utterance };
    switch (message.type) {
      case 'ready':
        this.readyWaiters.shift()?.resolve(message);
        break;
      case 'segment':
        this.segmentStarts.add(message.utterance);
        this.dispatchEvent(new CustomEvent('segment', { detail: message }));
        break;
      case 'words':
        if (!this.cancelled.has(message.utterance)) this.dispatchEvent(new CustomEvent('words', { detail: message }));
        break;
      case 'done':
        this.stats.utterancesDone += 1;
        this.#finish(message.utterance);
        if (message.audio_s === 0) this.timings.delete(message.utterance); // no first audio will come
        this.dispatchEvent(new CustomEvent('done', { detail: message }));
        break;
      case 'error':
        // An error of no utterance while a `ready` is awaited refuses that `start` (or the connection).
        if (message.utterance === null && this.readyWaiters.length > 0) {
          this.readyWaiters.shift()?.reject(new ProtocolError(message.code, message.message));
        }
        this.dispatchEvent(new CustomEvent('error', { detail: message }));
        break;
    }
  }

  /** @param {AudioFrame} frame */
  #audio(frame) {
    this.stats.framesReceived += 1;
    const utterance = this.base + frame.utterance;
    if (this.cancelled.has(utterance) || this.player === null) {
      this.stats.framesDropped += 1;
      return;
    }
    const timing = this.timings.get(utterance);
    if (timing) timing.receivedAt ??= performance.now();
    const segmentStart = this.segmentStarts.delete(utterance);
    if (utterance === this.head) this.player.play({ ...frame, utterance }, { segmentStart });
    else this.#held(utterance).frames.push({ frame: { ...frame, utterance }, segmentStart });
  }

  /**
   * An utterance is done: the player finishes it if it is playing, and the next ones' held audio follows.
   * @param {number} utterance
   */
  #finish(utterance) {
    this.utteranceContexts.delete(utterance);
    this.cancelled.delete(utterance);
    if (utterance !== this.head) {
      this.#held(utterance).done = true;
      return;
    }
    for (;;) {
      const idle = this.openUtterances.size === 0 && this.head === this.nextUtterance - 1;
      this.player?.finish(this.head, idle);
      this.head += 1;
      const next = this.held.get(this.head);
      if (next === undefined) return;
      this.held.delete(this.head);
      for (const { frame, segmentStart } of next.frames) this.player?.play(frame, { segmentStart });
      if (!next.done) return;
    }
  }

  /** @param {number} utterance */
  #held(utterance) {
    let held = this.held.get(utterance);
    if (held === undefined) this.held.set(utterance, (held = { frames: [], done: false }));
    return held;
  }

  /**
   * @param {number} utterance
   * @param {'decodedAt'} field
   */
  #mark(utterance, field) {
    const timing = this.timings.get(utterance);
    if (timing) timing[field] ??= performance.now();
  }

  /** @param {number} utterance */
  #firstAudio(utterance) {
    const timing = this.timings.get(utterance);
    if (!timing) return; // cancelled meanwhile
    this.timings.delete(utterance);
    const since = (/** @type {number | null} */ at) => (at === null ? null : at - timing.textAt);
    const detail = {
      utterance,
      latencyMs: performance.now() - timing.textAt,
      receivedMs: since(timing.receivedAt),
      decodedMs: since(timing.decodedAt),
    };
    this.stats.firstAudio = detail;
    this.dispatchEvent(new CustomEvent('firstAudio', { detail }));
  }

  /**
   * @param {string} code
   * @param {string} message
   */
  #fail(code, message) {
    this.dispatchEvent(new CustomEvent('error', { detail: { code, message, utterance: null } }));
  }
}

/** One context of a client's connection: the client's methods, with the context id filled in. */
export class VoxwireContext {
  /**
   * @param {VoxwireClient} client
   * @param {string} id
   */
  constructor(client, id) {
    this.client = client;
    this.id = id;
  }

  /**
   * This context's settings; resolves with its `ready`.
   * @param {ContextOptions} [changes]
   */
  configure(changes = {}) {
    return this.client.configure(changes, this.id);
  }

  /** @param {string} text */
  text(text) {
    this.client.text(text, this.id);
  }

  flush() {
    this.client.flush(this.id);
  }

  end() {
    this.client.end(this.id);
  }

  cancel() {
    this.client.cancel(this.id);
  }

  close() {
    this.client.closeContext(this.id);
  }
}

/**
 * The WebSocket URL of the stream endpoint.
 * @param {string | undefined} url `http(s)://` or `ws(s)://` server or endpoint; default this page's server
 * @param {string | undefined} token
 */
export function streamUrl(url, token) {
  const target = new URL(url ?? '/', globalThis.location?.href);
  target.protocol = target.protocol.replace(/^http/, 'ws');
  if (target.pathname === '/' || target.pathname === '') target.pathname = STREAM_PATH;
  if (token) target.searchParams.set('token', token);
  return target.href;
}
